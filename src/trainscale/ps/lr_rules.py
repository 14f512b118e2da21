"""Learning rates against staleness (``ps.lr_rule``), as the coefficients a server shard applies.

An update averages the gradients ``g_i`` it takes: ``w <- w - sum_i c_i g_i`` with ``c_i = lr_i / n``.

* ``constant``: ``lr_i = lr``.
* ``staleness`` (Zhang et al. 2016): ``lr_i = lr / max(1, staleness_i)``; a fresh gradient
  (staleness 0) keeps the base rate.
* ``distance`` (a distance-aware rate, as in staleness-aware async SGD): ``lr_i = min(C / ||w_now - w_used_i||^2, lr_max)``, one rate for every
  parameter, where ``w_used_i`` are the parameters gradient i was computed on; distance 0 gives lr_max.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RULES", "coefficients"]

RULES = ("constant", "staleness", "distance")


def coefficients(rule: str, lr: float, staleness: Sequence[int], sq_distances: Sequence[float] | None = None,
                 c: float = 0.01, lr_max: float = 0.1) -> list[float]:
    """Per-gradient coefficients ``c_i`` (the rate divided by the number of gradients averaged)."""
    n = len(staleness)
    if n == 0:
        return []
    if rule == "constant":
        rates = [lr] * n
    elif rule == "staleness":
        rates = [lr / max(1, s) for s in staleness]
    elif rule == "distance":
        if sq_distances is None or len(sq_distances) != n:
            raise ValueError("the distance rule needs one squared distance per gradient")
        rates = [lr_max if d <= 0 else min(c / d, lr_max) for d in sq_distances]
    else:
        raise ValueError(f"unknown lr rule {rule!r}; rules are {', '.join(RULES)}")
    return [r / n for r in rates]
