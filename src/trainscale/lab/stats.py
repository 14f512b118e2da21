"""The lab's step-time statistics from run summaries: block medians, the wait for the slowest rank, noise."""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..reporting.stats import Interval, mean_interval, median, rel_range
from ..schema import Col, cell

__all__ = ["median", "rel_range", "job_step_time", "median_se", "max_rank_gap", "rank_gap_se", "Interval",
           "mean_interval", "sync_wait", "critical_runq", "critical_data_wait", "arrivals_behind", "rank_runq",
           "framework_collectives_s"]

# A step longer than this many times its phase's median counts as this many. A shared disk or a prefetching
# loader makes a cost come in bursts (here 2-4x the median, one step in three); a VM's hiccup is 10-50x.
STEP_CLIP = 5.0


def block_step_time(rows: list[list[float]], weights: dict[int, int] | None = None) -> float:
    """Seconds per step of one rank in one phase: the median over cycles of each cycle's mean step time.

    ``rows`` are the phase's [cycle, step s, ...] rows; ``weights`` (cycle -> times drawn) is a bootstrap
    replicate. A median of single steps hides a cost paid in bursts (a loader that waits for a shared disk
    every other step costs the mean, not the median); a plain mean lets one hiccup decide. So steps are
    clipped at ``STEP_CLIP`` x the phase's median, averaged per cycle, and the median taken over cycles.
    """
    w = weights if weights is not None else {int(r[Col.CYCLE]): 1 for r in rows}
    blocks: dict[int, list[float]] = {}
    for r in rows:
        if w.get(int(r[Col.CYCLE]), 0) and math.isfinite(r[Col.STEP]):
            blocks.setdefault(int(r[Col.CYCLE]), []).append(r[Col.STEP])
    if not blocks:
        return float("nan")
    cap = STEP_CLIP * statistics.median(t for c, b in blocks.items() for _ in range(w[c]) for t in b)
    return statistics.median(statistics.fmean(min(t, cap) for t in b) for c, b in blocks.items() for _ in range(w[c]))


def sync_wait(ranks: list[list[list[float]]], weights: dict[int, int] | None = None) -> float:
    """Seconds per step that a synchronous step waits for whichever rank is slowest *that* step.

    ``ranks``: every rank's [cycle, step s, compute s, ...] rows of one phase in which the ranks synchronise each
    step, so row i is the same step everywhere. Each step lasts as long as its slowest rank's forward+backward;
    the mean of that maximum minus the slowest rank's own mean compute is what step-to-step jitter costs (seed
    002's order statistic E[X_P:P]; a rank that is slower on every step is the straggler, not counted here).
    Compute times are clipped at ``STEP_CLIP`` x each rank's median, as step times are.
    """
    if len(ranks) < 2:
        return 0.0
    n = min(len(rows) for rows in ranks)
    finite = [[r[Col.COMPUTE] for r in rows[:n] if math.isfinite(r[Col.COMPUTE])] for rows in ranks]
    caps = [STEP_CLIP * statistics.median(f) if f else math.inf for f in finite]
    steps = [(int(ranks[0][i][Col.CYCLE]), [min(rows[i][Col.COMPUTE], cap) for rows, cap in zip(ranks, caps)])
             for i in range(n)]
    w = weights if weights is not None else {c: 1 for c, _ in steps}
    drawn = [(w.get(c, 0), comp) for c, comp in steps if w.get(c, 0) and all(math.isfinite(x) for x in comp)]
    total = sum(k for k, _ in drawn)
    if not total:
        return 0.0
    slowest_each_step = sum(k * max(comp) for k, comp in drawn) / total
    slowest_rank = max(sum(k * comp[r] for k, comp in drawn) / total for r in range(len(ranks)))
    return slowest_each_step - slowest_rank


def step_runq(row: list[float], backend: bool = True, behind: float = 0.0) -> float:
    """Seconds of one rank's step lost waiting for a core: its main thread's run-queue wait, plus the backend
    threads' wait as far as the step waited for the exchange itself (their wait while the exchange still overlapped
    backward cost nothing, and neither did their wait while this rank, ``behind`` seconds ahead of the last to
    arrive, waited for that one). NaN without the run-queue columns (``Col.RUNQ_MAIN``, ``RUNQ_CRIT``, ``COMM_WAIT``)."""
    main = cell(row, Col.RUNQ_MAIN)
    if len(row) <= Col.COMM_WAIT or not math.isfinite(main):
        return float("nan")
    crit = cell(row, Col.RUNQ_CRIT) if backend else math.nan
    crit = crit if math.isfinite(crit) else main
    comm = cell(row, Col.COMM_WAIT)
    own = (comm if math.isfinite(comm) else 0.0) - (behind if math.isfinite(behind) else 0.0)
    return main + min(max(0.0, crit - main), max(0.0, own))


def arrivals_behind(rows: list[list[float]]) -> list[float]:
    """Per rank of one step: how long before the last rank it arrived at the exchange (``Col.ARRIVAL``, on
    a clock common to all ranks); NaN for all when one rank has no arrival or there is one rank."""
    arr = [cell(r, Col.ARRIVAL) for r in rows]
    if len(rows) < 2 or not all(math.isfinite(a) for a in arr):
        return [float("nan")] * len(rows)
    return [max(arr) - a for a in arr]


def critical_runq(ranks: list[list[list[float]]], weights: dict[int, int] | None = None, backend: bool = True
                  ) -> float:
    """Seconds per step the step waits because a rank's threads were runnable but not running.

    ``ranks``: every rank's rows of one phase (``schema.STEP_ROW``). A synchronous step waits for its last rank,
    and a collective for its slowest participant, so a rank descheduled for x ms delays everyone by up to x: per
    step, the largest ``step_runq`` over the ranks. A rank that waits in the exchange for a later one is not
    held up by its own backend threads' wait meanwhile, so that wait is left out (arrivals, ``arrivals_behind``).
    NaN when the rows carry no run-queue column (older summaries, no schedstat).
    """
    n = min((len(rows) for rows in ranks), default=0)
    steps = []
    for i in range(n):
        rows = [r[i] for r in ranks]
        runq = [step_runq(row, backend, b) for row, b in zip(rows, arrivals_behind(rows))]
        if all(math.isfinite(v) for v in runq):
            steps.append((int(ranks[0][i][Col.CYCLE]), max(runq)))
    return _cycle_mean(steps, weights)


def rank_runq(ranks: list[list[list[float]]], weights: dict[int, int] | None = None) -> list[float]:
    """Per rank: its training thread's mean run-queue wait per step (``Col.RUNQ_MAIN``) over the drawn cycles.

    The part of one rank's longer forward+backward that a wait for a core can explain is its own wait beyond the
    others' (``contention.cpu_contention`` caps what it takes out of the straggler with it). NaN for a rank
    without the column (no schedstat, an older summary).
    """
    return [_cycle_mean([(int(r[Col.CYCLE]), cell(r, Col.RUNQ_MAIN)) for r in rows], weights) for rows in ranks]


def _cycle_mean(values: list[tuple[int, float]], weights: dict[int, int] | None = None) -> float:
    """Mean of per-step ``(cycle, value)`` pairs, each counted as often as a bootstrap replicate drew its cycle
    (``weights``; None: every cycle once); non-finite values are left out. NaN when nothing is left."""
    drawn = [(1 if weights is None else weights.get(c, 0), v) for c, v in values if math.isfinite(v)]
    total = sum(k for k, _ in drawn)
    return sum(k * v for k, v in drawn) / total if total else float("nan")


def critical_data_wait(ranks: list[list[list[float]]]) -> float:
    """Seconds per step the step waited for a batch: per step, the longest data wait over the ranks (a synchronous
    step waits for its last rank's batch), averaged over the steps. NaN without the column (``Col.DATA_WAIT``)."""
    n = min((len(rows) for rows in ranks), default=0)
    waits = [max(cell(rows[i], Col.DATA_WAIT) for rows in ranks) for i in range(n)
             if all(math.isfinite(cell(rows[i], Col.DATA_WAIT)) for rows in ranks)]
    return sum(waits) / len(waits) if waits else float("nan")


def framework_collectives_s(part: dict[str, Any], weights: dict[int, int] | None = None) -> float:
    """Seconds a step of this phase held the job in the framework's own collectives outside DDP; 0 where none ran.

    Each rank's blocked seconds (``rank_framework_collective_steps``: [cycle, s] per timed step) are the median
    over cycles of each cycle's mean, like its step time. The rank that waits least in them is the one the others
    wait for: its seconds are the collectives' own cost plus each step's wait for whichever rank came last that
    step, which is what they add to the job's step; a rank slower on every step (a straggler) is not in them.
    ``weights``: a bootstrap replicate's cycles (cycle -> times drawn).
    """
    per_rank = []
    for rows in part.get("rank_framework_collective_steps") or []:
        blocks: dict[int, list[float]] = {}
        for c, v in rows:
            if v is not None and math.isfinite(v):
                blocks.setdefault(int(c), []).append(v)
        drawn = [statistics.fmean(b) for c, b in blocks.items() for _ in range(1 if weights is None else weights.get(c, 0))]
        if drawn:
            per_rank.append(statistics.median(drawn))
    return min(per_rank) if per_rank else 0.0


def job_step_time(summary: dict[str, Any]) -> float:
    """Seconds per step of the job: its slowest rank (ranks decoupled by ablate.comm finish at different times)."""
    ranks = [t for t in summary.get("rank_step_time_s") or [] if t is not None and math.isfinite(t)]
    return max(ranks) if ranks else float(summary["step_time_s"])


def _se(spread: float | None, value: float, n: int) -> float:
    """Standard error of a median of n values whose p10-p90 spread, relative to the median, is ``spread``.

    p90 - p10 of a normal distribution is 2.56 sigma; the median's standard error is 1.2533 sigma / sqrt(n).
    """
    if spread is None or not math.isfinite(spread) or not math.isfinite(value):
        return 0.0
    return 1.2533 * (spread * value / 2.563) / math.sqrt(max(1, n))


def median_se(summary: dict[str, Any]) -> float:
    """Standard error of a run's median step time, from its own p10-p90 spread and step count."""
    return _se(summary.get("step_time_spread"), job_step_time(summary), int(summary.get("measured_steps") or 1))


def rank_gap_se(summary: dict[str, Any], worst: int) -> float:
    """Standard error of ``max_rank_gap`` of a run's per-rank compute medians (0 without per-rank spreads)."""
    comp, spread = summary.get("rank_compute_s") or [], summary.get("rank_compute_spread") or []
    if len(spread) != len(comp) or len(comp) < 2:
        return 0.0
    n = int(summary.get("measured_steps") or 1)
    se = [_se(sp, c, n) for sp, c in zip(spread, comp)]
    others = se[:worst] + se[worst + 1:]
    return math.sqrt(se[worst] ** 2 + statistics.median(others) ** 2)


def max_rank_gap(values: list[float], rank: int | None = None) -> tuple[float, int]:
    """(slowest rank's value - the median of the others, slowest rank): how far one rank trails.

    ``rank`` fixes the rank compared (a signed gap, which can be negative): the bootstrap asks whether *that*
    rank is slower, since the largest of several equal ranks' noisy values is always above the others.
    """
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if len(vals) < 2:
        return 0.0, 0
    worst = max(range(len(vals)), key=lambda i: vals[i]) if rank is None or rank >= len(vals) else rank
    others = vals[:worst] + vals[worst + 1:]
    return vals[worst] - statistics.median(others), worst
