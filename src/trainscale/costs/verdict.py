"""What the planner does not model, and what a measured run below the forecast means.

Example::

    gaps([Point(...)], {8: 4.79}, error=0.15)   # -> one line per world size, pointing to the doctor
"""

from __future__ import annotations

from .forecast import Point

__all__ = ["NOT_MODELLED", "gaps", "PLANNER_ERROR"]

# The planner's own error measured on this kind of machine (benchmarks/campaigns/plan_accuracy.py, benchmarks/results/2026-11-24-plan-accuracy.md).
PLANNER_ERROR = 0.15

NOT_MODELLED = ("an operator that slows down only on many devices", "host scheduling overhead (an operator scheduler's "
                "op scheduler, Python launch cost)", "memory-bandwidth contention between devices of a node",
                "network congestion from other jobs", "data loading beyond the given input rate")


def gaps(points: list[Point], measured_speedup: dict[int, float], error: float = PLANNER_ERROR) -> list[str]:
    """For each measured world size, whether the forecast explains the measurement."""
    out = []
    for p in points:
        m = measured_speedup.get(p.world_size)
        if m is None:
            continue
        short = 1 - m / p.speedup
        if short > error:
            out.append(f"{p.world_size} devices: measured {m:.2f}x, forecast {p.speedup:.2f}x ({short:.0%} below, more "
                       f"than the forecast's {error:.0%} error). The forecast already counts communication "
                       f"({p.comm_exposed_s * 1e3:.1f} ms exposed per step), so communication does not explain the "
                       "gap: look for what the planner does not model (" + "; ".join(NOT_MODELLED[:3]) +
                       ") with `trainscale doctor`.")
        else:
            out.append(f"{p.world_size} devices: measured {m:.2f}x, forecast {p.speedup:.2f}x: within the forecast's "
                       f"{error:.0%} error.")
    return out
