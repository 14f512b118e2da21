"""The scaling loss as parts that add up: each additive cause, then one part for noise and what no cause holds.

A cause's share of the loss is its size over the loss, which is a share only between 0 and the loss. A cause
measured above the whole loss (its estimate and the loss each carry noise) or below zero (removing that part
made the N-process step faster, not slower) is said as what it is, never as "133%" or "-22%". Experiments that
are another configuration, not a part of this one (``threads``: another thread count; ``--apply``: the change
tried), are what-if results with their measured gain, reported apart.

Example::

    d = decompose(result)
    sum(p["s"] for p in d["parts"]) + d["rest_s"] == result["scaling_loss_s"]  # exactly, by construction
"""

from __future__ import annotations

import math
from typing import Any

from .invariants import ADDITIVE

__all__ = ["decompose", "share_text", "WHAT_IF", "what_if"]

WHAT_IF = ("threads",)  # causes that are another configuration's gain, not a part of the measured loss


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _part(c: dict[str, Any], loss: float, noise: float) -> dict[str, Any]:
    """One part: its seconds, its share where that is one (0..1), else what it is instead."""
    v = c["seconds_per_step"]
    part: dict[str, Any] = {"name": c["name"], "s": v, "share": None, "kind": "part"}
    if not _finite(loss) or loss <= 0:
        part["kind"] = "no_loss"  # nothing to take a share of (a job that scales as well as it can, or better)
    elif v < 0:
        part["kind"] = "faster"  # taking this part out made the N-process step faster than at 1
    elif v > loss:
        within = v - loss <= math.hypot(noise, c.get("noise_s") or 0.0) if _finite(c.get("noise_s")) else False
        part["kind"] = "above_loss_within_noise" if within else "above_loss"
    else:
        part["share"] = v / loss
    return part


def decompose(result: dict[str, Any]) -> dict[str, Any]:
    """``{"loss_s", "noise_s", "parts": [...], "rest_s"}``: the additive causes and the rest sum to the loss."""
    loss, noise = result["scaling_loss_s"], result.get("scaling_loss_noise_s") or 0.0
    parts = [_part(c, loss, noise) for c in result["causes"]
             if c["name"] in ADDITIVE and _finite(c["seconds_per_step"])]
    rest = loss - sum(p["s"] for p in parts) if _finite(loss) else float("nan")
    return {"loss_s": loss, "noise_s": noise, "parts": parts, "rest_s": rest,
            "rest_within_noise": bool(_finite(rest) and abs(rest) <= noise)}


def share_text(c: dict[str, Any], result: dict[str, Any]) -> str:
    """How a cause's share of the loss is printed: ``42%``, or what it is when it is not a share."""
    if c["name"] in WHAT_IF:
        return "what-if"
    if not _finite(c.get("seconds_per_step")):
        return "-"
    p = _part(c, result["scaling_loss_s"], result.get("scaling_loss_noise_s") or 0.0)
    return {"part": f"{(p['share'] or 0.0):.0%}", "no_loss": "-", "faster": "made it faster",
            "above_loss_within_noise": "all (above, within noise)", "above_loss": "above the loss"}[p["kind"]]


def what_if(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The experiments that tried another configuration, each with its measured gain per step at N."""
    out = []
    for c in result["causes"]:
        if c["name"] in WHAT_IF and _finite(c["seconds_per_step"]):
            step = result.get("step_time_n_s")
            out.append({"name": c["name"], "gain_s": c["seconds_per_step"],
                        "gain": c["seconds_per_step"] / step if _finite(step) and step else float("nan"),
                        "interval_s": c.get("interval_s"), "verdict": c["verdict"], "evidence": c["evidence"],
                        "suggestion": c["suggestion"]})
    return out
