"""Honest numbers from repeated runs: medians, spreads, the noise of a difference of medians."""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable

__all__ = ["median", "rel_spread", "job_step_time", "median_se", "max_rank_gap"]


def median(xs: Iterable[float]) -> float:
    """Median of the finite values (nan when there are none)."""
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(vals) if vals else float("nan")


def rel_spread(xs: Iterable[float]) -> float:
    """(max - min) / median across repeats: 0 for a single value."""
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    if len(vals) < 2:
        return 0.0
    m = statistics.median(vals)
    return (max(vals) - min(vals)) / m if m else float("nan")


def job_step_time(summary: dict[str, Any]) -> float:
    """Seconds per step of the job: its slowest rank (ranks decoupled by ablate.comm finish at different times)."""
    ranks = [t for t in summary.get("rank_step_time_s") or [] if t is not None and math.isfinite(t)]
    return max(ranks) if ranks else float(summary["step_time_s"])


def median_se(summary: dict[str, Any]) -> float:
    """Standard error of a run's median step time, from its own p10-p90 spread and step count.

    p90 - p10 of a normal distribution is 2.56 sigma; the median's standard error is 1.2533 sigma / sqrt(n).
    """
    n = max(1, int(summary.get("measured_steps") or 1))
    spread = summary.get("step_time_spread")
    if spread is None or not math.isfinite(spread):
        return 0.0
    sigma = spread * job_step_time(summary) / 2.563
    return 1.2533 * sigma / math.sqrt(n)


def max_rank_gap(values: list[float]) -> tuple[float, int]:
    """(slowest rank's value - the median of the others, slowest rank): how far one rank trails."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if len(vals) < 2:
        return 0.0, 0
    worst = max(range(len(vals)), key=lambda i: vals[i])
    others = vals[:worst] + vals[worst + 1:]
    return vals[worst] - statistics.median(others), worst
