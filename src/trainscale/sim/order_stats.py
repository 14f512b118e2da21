"""Order statistics of per-rank step times: stragglers and parameter-server modes (seed 002).

A synchronous step waits for the slowest of P ranks, E[X_{P:P}]. For normal noise that is
``mean + sigma * e_P`` (``e_P`` the expected maximum of P standard normals); for the exponential
delays of seed 002 the parameter-server modes reuse :mod:`trainscale.ps.theory`.

Example::

    expected_max_normal(4)   # 1.0294: the slowest of 4 ranks is ~1 sigma late
"""

from __future__ import annotations

import math

__all__ = ["expected_max_normal", "straggler_wait", "sigma_from_spread", "ps_update_time", "harmonic"]


def harmonic(n: int) -> float:
    """``H_n = 1 + 1/2 + ... + 1/n`` (0 for n <= 0)."""
    return sum(1.0 / i for i in range(1, n + 1))


def _phi(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2)))


def expected_max_normal(p: int) -> float:
    """E[max of P i.i.d. standard normals] by numerical integration (exact values: 0, 0.5642, 0.8463, 1.0294)."""
    if p <= 1:
        return 0.0
    # E[max] = integral of x * P * phi(x) * Phi(x)^(P-1) dx; trapezoid on [-8, 8] is accurate to 1e-9.
    n, lo, hi = 4000, -8.0, 8.0
    h = (hi - lo) / n
    total = 0.0
    for i in range(n + 1):
        x = lo + i * h
        w = 0.5 if i in (0, n) else 1.0
        total += w * x * p * _phi(x) * _cdf(x) ** (p - 1)
    return total * h


def sigma_from_spread(spread: float, median: float) -> float:
    """Standard deviation from a (p90 - p10) / median spread, assuming normal noise (p90 - p10 = 2.563 sigma)."""
    return max(0.0, spread) * median / 2.563


def straggler_wait(p: int, sigma: float) -> float:
    """Expected extra seconds a synchronous step waits for its slowest of P ranks: sigma x E[max of P]."""
    return sigma * expected_max_normal(p)


def ps_update_time(mode: str, p: int, k: int, mean: float, shift: float = 0.0) -> float:
    """Seconds per server update of a parameter-server mode (sync, k-sync, k-batch-sync, async, k-async, ...).

    Delegates to the PS layer's theory (exponential mini-batch times plus a fixed ``shift``).
    """
    from ..ps.theory import predicted_update_time  # pure Python: imports neither Ray nor torch

    return predicted_update_time(mode, p, k, mean, shift)
