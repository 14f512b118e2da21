"""Order statistics of per-rank step times: stragglers, and the parameter-server modes' update times.

A synchronous step waits for the slowest of P ranks, E[X_{P:P}]. For normal noise that is
``mean + sigma * e_P`` (``e_P`` the expected maximum of P standard normals).

For the parameter-server modes, mini-batch times are i.i.d. exponential (Dutta et al., "Slow and Stale
Gradients Can Win the Race", AISTATS 2018), with ``H_n = 1 + 1/2 + ... + 1/n``:

* sync waits for the slowest of P: ``E[X_{P:P}] = H_P * mean``;
* k-sync and k-async wait for the K-th of P fresh or memoryless clocks: ``E[X_{K:P}] = (H_P - H_{P-K}) * mean``
  (k-async restarts K learners while P-K keep going; memorylessness makes it the same race);
* async (K = 1 of k-async) gives ``mean / P``;
* the k-batch modes keep all P learners busy, a Poisson stream of rate P / mean: ``K * mean / P``.

The runtime theorem: ``E[T_sync] / E[T_async] = P * E[X_{P:P}] / E[X]`` (= P * H_P for exponentials).

Example::

    expected_max_normal(4)   # 1.0294: the slowest of 4 ranks is ~1 sigma late
"""

from __future__ import annotations

import math
from functools import lru_cache

__all__ = ["expected_max_normal", "straggler_wait", "sigma_from_spread", "harmonic", "order_statistic_exp",
           "predicted_update_time", "sync_async_ratio"]


def harmonic(n: int) -> float:
    """``H_n = 1 + 1/2 + ... + 1/n`` (0 for n <= 0)."""
    return sum(1.0 / i for i in range(1, n + 1))


def _phi(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2)))


@lru_cache(maxsize=4096)
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


def order_statistic_exp(k: int, p: int, mean: float) -> float:
    """``E[X_{K:P}]``, the K-th smallest of P i.i.d. exponentials with this mean."""
    if not 1 <= k <= p:
        raise ValueError(f"need 1 <= K <= P, got K={k}, P={p}")
    return (harmonic(p) - harmonic(p - k)) * mean


def predicted_update_time(mode: str, p: int, k: int, mean: float, shift: float = 0.0) -> float:
    """Expected seconds per server update of ``mode`` with mini-batch times ``shift + Exp(mean)``.

    ``shift = 0`` is the exponential model above. A positive shift (the fixed cost of a mini-batch besides its delay:
    launch, fetch, compute, push) adds to every order statistic, and to the cycle of the always-busy modes.
    """
    if mode == "sync":
        return shift + order_statistic_exp(p, p, mean)
    if mode == "async":
        return (shift + mean) / p
    if mode in ("k-sync", "k-async"):
        # k-async overlaps the shift of the P-K learners that keep going; k-sync pays it every update.
        return (shift if mode == "k-sync" else shift * k / p) + order_statistic_exp(k, p, mean)
    if mode in ("k-batch-sync", "k-batch-async"):
        return k * (shift + mean) / p
    if mode == "downpour":
        return (shift + mean) / p  # per shard: every learner pushes once per mini-batch
    raise ValueError(f"no prediction for mode {mode!r}")


def sync_async_ratio(p: int) -> float:
    """``E[T_sync] / E[T_async] = P * E[X_{P:P}] / E[X] = P * H_P`` for exponentials."""
    return p * harmonic(p)
