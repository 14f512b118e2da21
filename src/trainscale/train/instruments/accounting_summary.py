"""The run summary's ``accounting`` object, joined from every rank's ``Accounting.report()``."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

__all__ = ["merge_accounting", "cgroup_cores", "cgroup_throttled", "local_cpu_limits", "job_cores"]

_RANK_KEYS = ("rank", "pid", "host", "threads", "cpu_s", "runq_s")


def cgroup_cores(root: Path = Path("/sys/fs/cgroup")) -> float:
    """The CPU quota of this process's cgroup in cores (cgroup v2 ``cpu.max``, v1 ``cfs_quota_us``); inf if none."""
    try:
        v2_quota, v2_period = (root / "cpu.max").read_text().split()[:2]
        return math.inf if v2_quota == "max" else int(v2_quota) / int(v2_period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return math.inf if quota <= 0 else quota / period
    except (OSError, ValueError):
        return math.inf


def cgroup_throttled(tid: int, root: Path = Path("/sys/fs/cgroup"),
                     proc: Path = Path("/proc/self/task")) -> tuple[str, float] | None:
    """Thread ``tid``'s CPU cgroup and the seconds its tasks have been held back by the cgroup's CPU quota so far
    (``cpu.stat``: v1 ``throttled_time`` in ns, v2 ``throttled_usec``); None where neither is readable.

    Throttled tasks stay runnable but do not run; a throttled rank's collectives' threads hold up every rank
    while its training thread sleeps in the collective, where its own run-queue wait does not see it.
    """
    try:
        lines = (proc / str(tid) / "cgroup").read_text().splitlines()
        entries = [line.split(":", 2) for line in lines if line.count(":") >= 2]
        v1 = next((path for _, ctl, path in entries if "cpu" in ctl.split(",")), None)
        if v1 is not None:
            path, stat, key, unit = v1, root / "cpu" / v1.lstrip("/") / "cpu.stat", "throttled_time", 1e-9
        else:
            path = next(p for h, ctl, p in entries if h == "0" and ctl == "")
            stat, key, unit = root / path.lstrip("/") / "cpu.stat", "throttled_usec", 1e-6
        fields = dict(line.split() for line in stat.read_text().splitlines() if line.count(" ") == 1)
        return path, int(fields[key]) * unit
    except (OSError, ValueError, KeyError, StopIteration):
        return None


def host_busy_s(stat: Path = Path("/proc/stat")) -> float:
    """Seconds of CPU this host (every core, every process) has spent busy since boot; NaN where unreadable.

    Busy is user, nice, system, irq and softirq time (``/proc/stat``'s first line, in clock ticks): idle, I/O wait
    and the time a hypervisor gave the vCPUs to others (steal) are not.
    """
    try:
        v = [int(x) for x in stat.read_text().split("\n", 1)[0].split()[1:8]]
        return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):  # AttributeError: no os.sysconf (Windows)
        return math.nan


def local_cpu_limits() -> dict[str, Any]:
    """This process's CPUs: its affinity and its cgroup's quota (None: no quota)."""
    quota = cgroup_cores()
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return {"affinity": affinity, "quota": None if math.isinf(quota) else quota}


def job_cores(reports: list[dict[str, Any]]) -> int:
    """Cores the job may use on rank 0's host: the union of its ranks' affinities, capped by the cgroup quota."""
    host = reports[0]["host"]
    here = [r for r in reports if r["host"] == host]
    cpus = set().union(*(r["affinity"] for r in here))
    quotas = [r["quota"] for r in here if r.get("quota")]
    cap = math.ceil(min(quotas)) if quotas else len(cpus)
    return max(1, min(len(cpus), cap))


def merge_accounting(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``accounting`` object: method, clock offsets and their error bound, cores, and per rank its threads.

    ``cpu_s`` and ``runq_s`` hold per thread class the mean seconds per measured step. Offsets are measured
    even where schedstat is unavailable (then ``ranks`` is empty and the rows' columns 4-8 are NaN).
    """
    reason = next((f"rank {r['rank']}: {r['reason']}" for r in reports if r["reason"]), None)
    return {"method": "unavailable" if reason else "schedstat", "reason": reason,
            "clock_offsets_s": [r["offset"] for r in reports],
            "clock_error_s": max(r["bound"] for r in reports),
            "cores": job_cores(reports),
            "ranks": [] if reason else [{k: r[k] for k in _RANK_KEYS} for r in reports]}
