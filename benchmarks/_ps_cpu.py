"""CPU seconds of the processes of a local parameter-server run, read from /proc (Linux), by role.

Helper of ``ps_scaling.py`` and ``ps_breakdown.py``. Run on its own, it checks its /proc reader against
``os.times()`` on this process after 0.3 s of spinning; last line: one JSON object.

    python benchmarks/_ps_cpu.py
"""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def ray_daemons() -> list[int]:
    """Process ids of this machine's raylet and GCS server."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b"raylet" in cmd.split(b"\0")[0] or b"gcs_server" in cmd.split(b"\0")[0]:
                pids.append(int(d.name))
    return pids


class CpuMeter:
    """CPU seconds used by each role (``{"learners": [pids], ...}``) between :meth:`start` and :meth:`stop`."""

    def __init__(self, roles: dict[str, list[int]]):
        self.roles = roles
        self.before: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        return {role: sum(cpu_s(p) for p in pids) for role, pids in self.roles.items()}

    def start(self) -> None:
        """Take the starting reading."""
        self.before = self._read()

    def stop(self) -> dict[str, float]:
        """CPU seconds per role since :meth:`start`."""
        after = self._read()
        return {role: after[role] - self.before[role] for role in after}


def _self_check() -> dict:
    """This process's CPU seconds as read from /proc and as ``os.times()`` says, after 0.3 s of spinning."""
    import time

    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        pass
    t = os.times()
    proc, own = cpu_s(os.getpid()), t.user + t.system
    return {"proc_cpu_s": proc, "os_times_cpu_s": own, "abs_diff_s": abs(proc - own), "tick_s": 1 / _TICK}


if __name__ == "__main__":
    import json

    print(json.dumps(_self_check()))
