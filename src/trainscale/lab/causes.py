"""One cause of the scaling loss as the doctor reports it: its size per repeat, its noise and its lower bound."""

from __future__ import annotations

import math
import statistics
from typing import Any

__all__ = ["Runs", "ms", "term", "make_cause"]

Runs = dict[tuple[str, int], list[dict[str, Any]]]


def ms(seconds: float) -> str:
    """Seconds as milliseconds with two decimals, as the evidence lines write them."""
    return f"{seconds * 1e3:.2f}"


def term(per_repeat: list[float], sources: list[list[float]]) -> tuple[float, float, float]:
    """(median over repeats, noise, lower bound) of a term measured once per repeat.

    ``sources``: per-repeat standard errors of the medians the term is made of. Each repeat's value has the
    noise 2 x their root-sum-square; the term's noise is the largest of those, and its lower bound is the
    smallest of value - noise over the repeats: above zero only when every repeat shows the term.
    """
    pairs = [(v, 2.0 * math.sqrt(sum(src[i] ** 2 for src in sources if i < len(src))))
             for i, v in enumerate(per_repeat) if math.isfinite(v)]
    if not pairs:
        return float("nan"), float("nan"), float("nan")
    return (statistics.median(v for v, _ in pairs), max(e for _, e in pairs), min(v - e for v, e in pairs))


def make_cause(name: str, per_repeat: list[float], sources: list[list[float]], loss: float, evidence: str,
               suggestion: str = "", flags: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    value, noise, low = term(per_repeat, sources)
    return {"name": name, "seconds_per_step": value, "noise_s": noise, "low_s": low,
            "share": value / loss if loss > 0 and math.isfinite(value) else float("nan"),
            "per_repeat_s": per_repeat, "evidence": evidence, "suggestion": suggestion,
            "apply_flags": flags or {}, **extra}
