"""A CPU host shared by the job's ranks and other programs, as processor sharing. Pure functions (no torch).

Every runnable thread on the host gets an equal share of its cores (Linux CFS, one cgroup): with ``n``
runnable threads on ``C`` cores each runs ``max(1, n / C)`` times slower than on a core of its own. The job's
ranks add ``P x T`` threads; other programs add ``k`` (measured as they are during calibration, not assumed
away). A step then costs each rank its CPU seconds (compute, loop, Gloo's all-reduce work) at that slow-down:
on a CPU backend communication is not free to overlap, it takes cycles the compute would have had.

Example::

    s = thread_slowdown(share_per_thread(cpu_s=0.25, wall_s=0.5, threads=1))   # 2.0: half a core each
    shared_step_s(cpu_s=0.25 + 0.03, threads=1, slowdown=s)                     # 0.56 s per step
"""

from __future__ import annotations

__all__ = ["share_per_thread", "thread_slowdown", "outside_threads", "slowdown_at", "shared_step_s"]


def share_per_thread(cpu_s: float, wall_s: float, threads: int) -> float:
    """Share of one core each of a process's ``threads`` got: its CPU seconds over wall seconds x threads (<= 1)."""
    if wall_s <= 0 or cpu_s <= 0:
        return 1.0
    return min(1.0, cpu_s / (wall_s * max(1, threads)))


def thread_slowdown(share: float) -> float:
    """How many times slower a thread ran than on a free core, from its measured share (1 = no sharing)."""
    return 1.0 / max(share, 1e-3)


def outside_threads(share: float, threads: int, cores: int, free: float = 0.97) -> float:
    """Runnable threads of other programs implied by ``threads`` of ours each getting ``share`` of a core.

    Equal shares on a full host: ``share = C / (T + k)``, so ``k = C / share - T``. A share above ``free``
    means our threads were not held back: the others fit in the spare cores (k <= C - T), taken as 0.
    """
    if share >= free:
        return 0.0
    return max(0.0, cores / max(share, 1e-3) - threads)


def slowdown_at(ranks: int, threads: int, cores: int, outside: float) -> float:
    """Per-thread slow-down of ``ranks`` x ``threads`` threads beside ``outside`` others: max(1, (P T + k) / C)."""
    return max(1.0, (ranks * threads + outside) / max(1, cores))


def shared_step_s(cpu_s: float, threads: int, slowdown: float) -> float:
    """Wall seconds for a rank to spend ``cpu_s`` CPU seconds on ``threads`` threads each slowed ``slowdown``."""
    return cpu_s * slowdown / max(1, threads)
