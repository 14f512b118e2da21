"""The doctor's accounting rules, checked on every result it writes (and on every report the suite produces).

1. Every cause's point estimate lies inside its own interval.
2. The additive causes sum to the measured scaling loss, or the result says how much is unexplained.
3. A cause that moved time into another says so in both rows, with the same amount.
4. The bottleneck's shares of the step add up to 1.
5. The decomposition's parts and its rest (noise and unexplained) add up to the scaling loss, and every share it
   gives lies between 0 and 1 (a part above the loss or below zero is named as such, never as a share).

``violations(result)`` lists what breaks a rule (empty when the accounting is honest).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["ADDITIVE", "violations", "explain_rest", "widen_to_point"]

# Causes that partition the scaling loss (the telescoping terms and what was moved out of them); ``threads`` is
# another configuration's gain, not a part of this one's loss.
ADDITIVE = ("input", "communication", "sync_wait", "straggler", "compute_interference", "framework_overhead",
            "slow_operator", "external_load", "cpu_contention")
_EPS = 1e-9


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def widen_to_point(c: dict[str, Any]) -> None:
    """Make ``c``'s interval contain its point estimate, saying so (a resampled estimator can land off its point)."""
    lo, hi = c.get("interval_s") or (c["seconds_per_step"], c["seconds_per_step"])
    v = c["seconds_per_step"]
    if _finite(v) and _finite(lo) and _finite(hi) and not lo - _EPS <= v <= hi + _EPS:
        c["interval_s"] = [min(lo, v), max(hi, v)]
        c["low_s"] = min(c.get("low_s", lo), v)
        c["interval_widened"] = True


def explain_rest(result: dict[str, Any]) -> None:
    """Set ``unexplained_s``: the scaling loss the additive causes leave over (reported when beyond the noise)."""
    total = sum(c["seconds_per_step"] for c in result["causes"]
                if c["name"] in ADDITIVE and _finite(c["seconds_per_step"]))
    loss = result["scaling_loss_s"]
    rest = loss - total if _finite(loss) else float("nan")
    result["explained_s"] = total
    result["unexplained_s"] = rest
    result["unexplained_beyond_noise"] = bool(_finite(rest) and abs(rest) > result.get("scaling_loss_noise_s", 0.0))


def violations(result: dict[str, Any]) -> list[str]:
    """Every broken rule of the module docstring, one line each."""
    bad: list[str] = []
    by = {c["name"]: c for c in result.get("causes", [])}
    for c in result.get("causes", []):
        v, iv = c["seconds_per_step"], c.get("interval_s")
        if _finite(v) and iv and _finite(iv[0]) and _finite(iv[1]) and not iv[0] - _EPS <= v <= iv[1] + _EPS:
            bad.append(f"{c['name']}: estimate {v * 1e3:+.3f} ms outside its interval "
                       f"[{iv[0] * 1e3:+.3f}, {iv[1] * 1e3:+.3f}] ms")
        for move in c.get("moved_to", []):
            other = by.get(move["cause"])
            got = [m for m in (other or {}).get("moved_from", []) if m["cause"] == c["name"]]
            if not got or abs(got[0]["s"] - move["s"]) > 1e-9:
                bad.append(f"{c['name']}: moved {move['s'] * 1e3:.3f} ms to {move['cause']}, which does not say so")
    if _finite(result.get("scaling_loss_s")) and "unexplained_s" in result:
        total = sum(c["seconds_per_step"] for c in result["causes"]
                    if c["name"] in ADDITIVE and _finite(c["seconds_per_step"]))
        if abs(result["scaling_loss_s"] - total - result["unexplained_s"]) > 1e-9:
            bad.append("the causes and the unexplained rest do not add up to the scaling loss")
    elif _finite(result.get("scaling_loss_s")):
        bad.append("no unexplained_s: the result does not say how much of the loss its causes leave over")
    bad += _decomposition_breaks(result.get("decomposition"))
    b = result.get("bottleneck")
    if b and b.get("shares"):
        s = sum(v for v in b["shares"].values() if _finite(v))
        if abs(s - 1.0) > 1e-6:
            bad.append(f"bottleneck shares add up to {s:.4f}, not 1")
    return bad


def _decomposition_breaks(d: dict[str, Any] | None) -> list[str]:
    """Rule 5: the parts and the rest sum to the loss; no share outside 0..1."""
    if not d or not _finite(d.get("loss_s")):
        return []
    bad = []
    total = sum(p["s"] for p in d["parts"]) + d["rest_s"]
    if abs(total - d["loss_s"]) > 1e-9:
        bad.append(f"the decomposition's parts and rest add up to {total * 1e3:+.3f} ms, not the scaling loss "
                   f"{d['loss_s'] * 1e3:+.3f} ms")
    bad += [f"{p['name']}: share {p['share']:.3f} outside 0..1" for p in d["parts"]
            if p.get("share") is not None and not -_EPS <= p["share"] <= 1 + _EPS]
    return bad
