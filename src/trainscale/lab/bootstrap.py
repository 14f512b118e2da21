"""Intervals that hold on a noisy machine: the doctor's causes, re-estimated on runs resampled by whole cycles.

Step times on a shared VM are skewed (a step can take 10x the median), autocorrelated (a slow minute slows
many steps in a row) and switch between modes, so a normal-theory standard error from a p10-p90 spread is
wrong in both directions. The doctor's runs interleave their phases in blocks (``ablate.phases``); one pass
through every phase is a *cycle*. Resampling whole cycles with replacement (a moving-block bootstrap whose
blocks are the design's own) keeps the pairing of phases inside a cycle and the dependence inside a block,
and each phase's step time is a median over cycles of clipped cycle means (``stats.block_step_time``), so a
single 10x step cannot move anything while a cost paid every few steps still counts.

A resampled run is the same summary with each phase's per-rank step times recomputed from the resampled steps;
the doctor's arithmetic (``analysis``) runs unchanged on it, so every cause gets a distribution.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..schema import PHASES, Col
from .stats import block_step_time, critical_runq, framework_collectives_s, rank_runq, sync_wait

__all__ = ["resample_runs", "block_times", "interval", "verdict", "outlier_count", "throughput", "PHASE_KEYS"]

PHASE_KEYS = PHASES  # the three paired experiments, in the order the analysis reads them
Runs = dict[tuple[str, int], list[dict[str, Any]]]


def _cycles(part: dict[str, Any]) -> list[int]:
    rows = (part.get("rank_steps") or [[]])[0]
    return sorted({int(r[Col.CYCLE]) for r in rows})


def _resampled_part(part: dict[str, Any], weights: Counter | None) -> dict[str, Any]:
    """The phase summary with per-rank step times (``block_step_time``), compute medians and the wait for each
    step's slowest rank (``sync_wait``) over the resampled cycles (``weights``: cycle -> times drawn; None: every
    cycle once)."""
    ranks = part.get("rank_steps")
    if not ranks:
        return part
    steps, comps = [], []
    for rows in ranks:
        w = weights if weights is not None else Counter({int(r[Col.CYCLE]): 1 for r in rows})
        c = [r[Col.COMPUTE] for r in rows for _ in range(w.get(int(r[Col.CYCLE]), 0)) if math.isfinite(r[Col.COMPUTE])]
        steps.append(block_step_time(rows, w))
        comps.append(statistics.median(c) if c else float("nan"))
    return {**part, "rank_step_time_s": steps, "rank_compute_s": comps, "step_time_s": steps[0],
            "sync_wait_s": sync_wait(ranks, weights), "runq_crit_s": critical_runq(ranks, weights),
            "runq_main_crit_s": critical_runq(ranks, weights, backend=False), "rank_runq_main_s": rank_runq(ranks, weights),
            "framework_collectives_s": framework_collectives_s(part, weights)}


def block_times(runs: Runs) -> Runs:
    """``runs`` with every phased part's per-rank step times as the replicates estimate them."""
    return {key: [_resampled_part(p, None) for p in parts] for key, parts in runs.items()}


def throughput(part: dict[str, Any], rng: random.Random | None = None) -> float:
    """Samples/s of a phase over its timed steps, as the summary counts it (rank 0's total time); with ``rng``,
    over its cycles drawn with replacement. A total, not a median: a change that makes one step in four slow
    (local SGD's exchange) is judged on all of them."""
    rows = (part.get("rank_steps") or [[]])[0]
    if not rows:
        return float(part["samples_per_s"])
    cycles = _cycles(part)
    weights = Counter(rng.choice(cycles) for _ in cycles) if rng else None
    steps = [r[Col.STEP] for r in rows for _ in range(weights.get(int(r[Col.CYCLE]), 0) if weights else 1)]
    return len(steps) * part["global_batch"] / sum(steps) if steps else float("nan")


def resample_runs(runs: Runs, rng: random.Random) -> Runs:
    """One bootstrap replicate: every phased run's cycles drawn with replacement, all its phases alike."""
    out: Runs = {key: list(parts) for key, parts in runs.items()}
    n_rep = {k: len(v) for k, v in runs.items()}
    for k in {k for (_, k) in runs}:
        for r in range(max((n_rep.get((p, k), 0) for p in PHASE_KEYS), default=0)):
            parts = [runs[(p, k)][r] for p in PHASE_KEYS if r < n_rep.get((p, k), 0)]
            cycles = sorted({c for part in parts for c in _cycles(part)})
            if not cycles:
                continue
            weights = Counter(rng.choice(cycles) for _ in cycles)
            for p in PHASE_KEYS:
                if r < n_rep.get((p, k), 0):
                    out[(p, k)][r] = _resampled_part(runs[(p, k)][r], weights)
    return out


def interval(values: list[float], level: float = 0.90) -> tuple[float, float, float]:
    """(low, high, share above zero) of bootstrap replicates: the central ``level`` percentile interval."""
    vals = sorted(v for v in values if math.isfinite(v))
    if not vals:
        return float("nan"), float("nan"), float("nan")
    a = (1 - level) / 2
    lo = vals[int(math.floor(a * (len(vals) - 1) + 1e-9))]
    hi = vals[int(math.ceil((1 - a) * (len(vals) - 1) - 1e-9))]
    return lo, hi, sum(v > 0 for v in vals) / len(vals)


def verdict(value: float, low: float, p_positive: float, floor: float) -> str:
    """A plain word: ``clear`` (the whole interval lies above the floor worth reporting), ``likely`` (>= 80% of
    replicates above zero), ``undecided`` (big enough to matter, too noisy to say), ``no`` (smaller than the floor).

    ``clear`` asks for the low end above the floor, not only above zero: a cause whose estimate just passes the
    floor while its interval reaches well below it is real but not shown to matter (a clean job on 2 cores:
    forward+backward 2.09 ms/step slower at 2 processes, 90% interval 1.28 .. 7.02 ms, against a floor of 2.03 ms,
    5% of its step; 1.54 ms and less in two other runs of the same job).
    """
    if not math.isfinite(value) or value < floor or value <= 0:
        return "no"
    if math.isfinite(low) and low > max(floor, 0.0):
        return "clear"
    return "likely" if p_positive >= 0.8 else "undecided"


def outlier_count(runs: Runs, factor: float = 10.0) -> int:
    """Steps that took more than ``factor`` x their phase's median (kept, but unable to move a median)."""
    n = 0
    for parts in runs.values():
        for part in parts:
            for rows in part.get("rank_steps") or []:
                times = [r[Col.STEP] for r in rows]
                if times:
                    m = statistics.median(times)
                    n += sum(t > factor * m for t in times)
    return n


def bootstrap(runs: Runs, estimate: Callable[[Runs], dict[str, float]], replicates: int = 300,
              seed: int = 0) -> dict[str, list[float]]:
    """Each cause's replicate values: ``estimate`` applied to ``replicates`` resampled copies of ``runs``."""
    rng = random.Random(seed)
    out: dict[str, list[float]] = {}
    for _ in range(replicates):
        for name, v in estimate(resample_runs(runs, rng)).items():
            out.setdefault(name, []).append(v)
    return out
