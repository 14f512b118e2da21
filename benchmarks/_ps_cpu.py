"""Helper module (not a benchmark: it prints nothing). CPU seconds of the processes of a local parameter-server run, read from /proc (Linux), by role.

Helper of ``ps_scaling.py`` and ``ps_breakdown.py``; not a benchmark itself.
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
