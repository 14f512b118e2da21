"""Expected time per update of each mode when mini-batch times are i.i.d. exponential (seed 002).

With ``X_i ~ Exp(mean)`` and ``H_n = 1 + 1/2 + ... + 1/n``:

* sync waits for the slowest of P: ``E[X_{P:P}] = H_P * mean``;
* k-sync and k-async wait for the K-th of P fresh or memoryless clocks: ``E[X_{K:P}] = (H_P - H_{P-K}) * mean``
  (k-async restarts K learners while P-K keep going; memorylessness makes it the same race);
* async (K = 1 of k-async) gives ``mean / P``;
* the k-batch modes keep all P learners busy, a Poisson stream of rate P / mean: ``K * mean / P``.

Seed 002's theorem: ``E[T_sync] / E[T_async] = P * E[X_{P:P}] / E[X]`` (= P * H_P for exponentials).
"""

from __future__ import annotations

__all__ = ["harmonic", "order_statistic_exp", "predicted_update_time", "sync_async_ratio", "ring_bytes", "ps_bytes"]


def harmonic(n: int) -> float:
    """``H_n`` (0 for n <= 0)."""
    return sum(1.0 / i for i in range(1, n + 1))


def order_statistic_exp(k: int, p: int, mean: float) -> float:
    """``E[X_{K:P}]``, the K-th smallest of P i.i.d. exponentials with this mean."""
    if not 1 <= k <= p:
        raise ValueError(f"need 1 <= K <= P, got K={k}, P={p}")
    return (harmonic(p) - harmonic(p - k)) * mean


def predicted_update_time(mode: str, p: int, k: int, mean: float) -> float:
    """Expected seconds per server update of ``mode`` with exponential mini-batch times."""
    if mode == "sync":
        return order_statistic_exp(p, p, mean)
    if mode == "async":
        return mean / p
    if mode in ("k-sync", "k-async"):
        return order_statistic_exp(k, p, mean)
    if mode in ("k-batch-sync", "k-batch-async"):
        return k * mean / p
    if mode == "downpour":
        return mean / p  # per shard: every learner pushes once per mini-batch
    raise ValueError(f"no prediction for mode {mode!r}")


def sync_async_ratio(p: int) -> float:
    """``E[T_sync] / E[T_async] = P * E[X_{P:P}] / E[X] = P * H_P`` for exponentials."""
    return p * harmonic(p)


def ps_bytes(n_bytes: int, learners: int) -> int:
    """Bytes through the server per synchronous update: every learner pushes N and pulls N."""
    return 2 * n_bytes * learners


def ring_bytes(n_bytes: int, learners: int) -> tuple[float, float]:
    """Ring all-reduce of the same gradients: (bytes each learner sends, bytes over all links)."""
    per = 2 * n_bytes * (learners - 1) / learners
    return per, per * learners
