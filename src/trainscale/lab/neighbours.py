"""What else uses the machine while the doctor's runs go: CPU time of processes outside the job, GPU users.

Sampled from ``psutil`` (and NVML through ``nvidia-ml-py`` when installed) by a background thread: each
process's CPU seconds between the first and last sight of it, over the wall time watched, in cores. The
lab's own process tree (the launcher and every rank it started) is the job and is left out.

A process that ended while watched counts under its nearest ancestor still running at the end (the one a user
can move or stop): a second job that starts new ranks for every run, or a build's compiler processes, is many
short processes under 0.05 cores each over a long doctor run, and summed apart they added up to one core that
the report left out (a second doctor beside a 509 s run: 0.07 cores reported). Such a process's last moments
fall between samples, and one that lives less than a sample interval is never seen: for an ancestor that waits
for them, the kernel keeps their whole CPU time in its children's times (``cutime``/``cstime`` of
``/proc/PID/stat``), which are read too, so what it started and reaped counts whole.
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["LoadMonitor", "describe"]


class _Seen:
    """One outside process as sampled: its CPU seconds and its reaped children's, at first and last sight."""

    __slots__ = ("name", "parent", "cpu_first", "cpu_last", "reaped_first", "reaped_last")

    def __init__(self, name: str, parent: int, cpu: float, reaped: float, born_inside: bool):
        self.name, self.parent = name, parent
        # Born while we watched: all its CPU time is in the window (short-lived work would vanish otherwise).
        self.cpu_first = 0.0 if born_inside else cpu
        self.reaped_first = 0.0 if born_inside else reaped
        self.cpu_last, self.reaped_last = cpu, reaped


class LoadMonitor:
    """``with LoadMonitor() as m: ...`` then ``m.report()``: cores used outside this process tree, by whom."""

    def __init__(self, interval_s: float = 0.5, min_cores: float = 0.05):
        self.interval_s, self.min_cores = interval_s, min_cores
        self._seen: dict[int, _Seen] = {}  # pid -> what was sampled of it (parent as first seen)
        self._alive: set[int] = set()  # pids seen in the last sample
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = self.t1 = self.wall_t0 = 0.0
        self.gpu_users: list[dict[str, Any]] = []

    def __enter__(self) -> LoadMonitor:
        self.t0, self.wall_t0 = time.monotonic(), time.time()
        self._thread = threading.Thread(target=self._run, name="trainscale-load-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.t1 = time.monotonic()

    def _ours(self) -> set[int]:
        import psutil
        me = psutil.Process()
        pids = {me.pid}
        try:
            pids |= {c.pid for c in me.children(recursive=True)}
        except psutil.Error:
            pass
        return pids

    def _sample(self) -> None:
        import psutil
        ours, alive = self._ours(), set()
        for p in psutil.process_iter(["pid", "ppid", "name", "cpu_times", "create_time"]):
            info = p.info
            if info["pid"] in ours or info["cpu_times"] is None:
                continue
            t = info["cpu_times"]
            cpu = t.user + t.system
            reaped = getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
            seen = self._seen.get(info["pid"])
            if seen is None:
                self._seen[info["pid"]] = _Seen(info["name"] or "?", info["ppid"] or 0, cpu, reaped,
                                                (info["create_time"] or 0) > self.wall_t0)
            else:
                seen.cpu_last, seen.reaped_last = cpu, reaped
            alive.add(info["pid"])
        self._alive = alive

    def _run(self) -> None:
        try:
            import psutil  # noqa: F401  (a core dependency; an odd install without it reports no outside load)
        except ImportError:
            return
        self._gpu()
        while True:
            self._sample()
            if self._stop.wait(self.interval_s):
                self._sample()
                return

    def _gpu(self) -> None:
        """Processes on this machine's GPUs that are not ours (NVML, when nvidia-ml-py is installed)."""
        try:
            import pynvml
            pynvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no NVML, no GPU: nothing to report
            return
        ours = self._ours()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if proc.pid not in ours:
                    self.gpu_users.append({"gpu": i, "pid": proc.pid, "memory_mb": (proc.usedGpuMemory or 0) / 2**20})

    def _owner(self, pid: int) -> int:
        """The pid itself while it runs, else its nearest ancestor seen running in the last sample (else itself)."""
        at, seen = pid, set()
        while at not in self._alive and at in self._seen and at not in seen:
            seen.add(at)
            at = self._seen[at].parent
        return at if at in self._alive and at in self._seen else pid

    def report(self) -> dict[str, Any]:
        """``{"cores": outside load in cores, "machine_cores": N, "top": [{pid, name, cores, ended}],
        "gpu_users": [...]}``: ``cores`` counts every outside process; ``top`` lists those over ``min_cores``,
        each with the processes it started that ended while watched (``ended``, their CPU in its ``cores``)."""
        wall = max(1e-9, (self.t1 or time.monotonic()) - self.t0)
        by: dict[int, dict[str, Any]] = {}
        ended_cpu: dict[int, float] = {}  # owner -> CPU s sampled of the processes it started that ended
        for pid, seen in self._seen.items():
            owner = self._owner(pid)
            row = by.setdefault(owner, {"pid": owner, "name": self._seen[owner].name, "cores": 0.0, "ended": 0})
            cpu = seen.cpu_last - seen.cpu_first
            if owner == pid:
                row["cores"] += cpu / wall
            else:
                row["ended"] += 1
                ended_cpu[owner] = ended_cpu.get(owner, 0.0) + cpu
        for owner, row in by.items():
            if owner in self._alive:  # what it reaped counts whole; the samples of what it started, at least
                reaped = self._seen[owner].reaped_last - self._seen[owner].reaped_first
                row["cores"] += max(reaped, ended_cpu.get(owner, 0.0)) / wall
            else:
                row["cores"] += ended_cpu.get(owner, 0.0) / wall
        rows = sorted(by.values(), key=lambda r: -r["cores"])
        from .common import cores
        return {"cores": sum(r["cores"] for r in rows), "machine_cores": cores(),
                "top": [r for r in rows if r["cores"] >= self.min_cores][:8], "gpu_users": self.gpu_users,
                "seconds": wall}


def describe(p: dict[str, Any], cores: bool = True) -> str:
    """One outside process of ``LoadMonitor.report()``'s ``top`` as the reports name it."""
    ended = f" and {p['ended']} processes it started" if p.get("ended") else ""
    return f"{p['name']} (pid {p['pid']}{ended}" + (f", {p['cores']:.2f} cores)" if cores else ")")
