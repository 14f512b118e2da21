"""Honest numbers from repeated runs: medians, relative ranges, means with their Student-t intervals."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Interval", "mean_interval", "median", "rel_range", "median_interdecile"]

# Student's t, 97.5% quantile, for 1..10 degrees of freedom (a 95% interval from a handful of seeds).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def _t975(df: int) -> float:
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion of t around the normal: within 0.002 of the table from df = 10
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclass(frozen=True)
class Interval:
    """Mean of independent repeats (seeds) with its standard error and 95% Student-t interval."""

    mean: float
    se: float  # standard error of the mean (sample sd / sqrt(n)); nan for a single value
    lo: float  # 95% interval: mean -/+ t(0.975, n-1) * se
    hi: float
    n: int

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in the 95% interval."""
        return self.lo <= value <= self.hi

    def fmt(self, scale: float = 1.0, digits: int = 1) -> str:
        """``"837.3 ± 12.1"`` (mean ± standard error), scaled (1e3 for ms)."""
        if self.se is None or not math.isfinite(self.se):
            return f"{self.mean * scale:.{digits}f}"
        return f"{self.mean * scale:.{digits}f} ± {self.se * scale:.{digits}f}"

    def to_json(self) -> dict[str, float | int | None]:
        """The fields as a dict; null for what too few values cannot give (strict JSON has no NaN)."""
        return {k: v if isinstance(v, int) or math.isfinite(v) else None
                for k, v in (("mean", self.mean), ("se", self.se), ("lo", self.lo), ("hi", self.hi), ("n", self.n))}


def mean_interval(xs: Iterable[float | None]) -> Interval:
    """Mean, standard error and 95% t-interval of the finite values.

    Example::

        mean_interval([0.81, 0.84, 0.90])  # Interval(mean=0.85, se=0.026, lo=0.74, hi=0.96, n=3)
    """
    vals = [float(x) for x in xs if x is not None and math.isfinite(x)]
    if not vals:
        return Interval(float("nan"), float("nan"), float("nan"), float("nan"), 0)
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return Interval(m, float("nan"), float("nan"), float("nan"), 1)
    se = statistics.stdev(vals) / math.sqrt(len(vals))
    half = _t975(len(vals) - 1) * se
    return Interval(m, se, m - half, m + half, len(vals))


def median(xs: Iterable[float | None]) -> float:
    """Median of the finite values (nan when there are none)."""
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(vals) if vals else float("nan")


def rel_range(xs: Iterable[float | None]) -> float:
    """Relative range, (max - min) / median, across repeats: 0 for a single value (a run's own timings use the
    interdecile range instead, ``train.summary.median_interdecile``)."""
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    if len(vals) < 2:
        return 0.0
    m = statistics.median(vals)
    return (max(vals) - min(vals)) / m if m else float("nan")


def median_interdecile(values: list[float]) -> tuple[float, float]:
    """Median and relative interdecile range, (p90 - p10) / median, of a list of timings (the summary's
    ``*_spread`` fields; ``reporting.stats.rel_range`` is max - min over repeats instead)."""
    if not values:
        return float("nan"), float("nan")
    med = statistics.median(values)
    s = sorted(values)
    lo, hi = s[int(0.1 * (len(s) - 1))], s[int(0.9 * (len(s) - 1))]
    return med, ((hi - lo) / med if med else float("nan"))
