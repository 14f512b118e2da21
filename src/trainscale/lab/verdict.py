"""Verdicts that open the lab reports: the bench efficiency with its noise and a word, and the doctor's
adopt / do not adopt after --apply.

Pure code over bench points, so tests drive it with numbers. With repeats, the efficiency's range is that
of every pairing of a run at N with a run at the base size (samples/s_N / (ratio x samples/s_1)); the
loss is significant when that whole range lies below 100%. With one run per point it falls back to
two standard errors of each run's own median step, which understates run-to-run variation, and the
line says so.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

__all__ = ["bench_verdict", "point_noise", "adopt_verdict"]


def point_noise(p: dict[str, Any]) -> float:
    """Relative standard error of a point's median step time, from its p10-p90 spread and step count."""
    spread = p.get("step_time_spread")
    if spread is None or not math.isfinite(spread):
        return float("nan")
    steps = max(1, int(p.get("measured_steps") or 1))
    return 1.2533 * (spread / 2.563) / math.sqrt(steps)  # p10-p90 of a normal is 2.563 sigma


def bench_verdict(points: list[dict[str, Any]], train_args: list[str], script: list[str] | None = None
                  ) -> dict[str, Any] | None:
    """Efficiency at the largest world size with its noise, 'significant' or 'inconclusive', and the next command."""
    if len(points) < 2:
        return None
    base, top = points[0], points[-1]
    eff = top["efficiency"]
    ratio = top["world_size"] / base["world_size"]
    runs_b, runs_t = base.get("samples_per_s_runs") or [], top.get("samples_per_s_runs") or []
    one_run = len(runs_b) < 2 or len(runs_t) < 2
    if one_run:
        noise = 2 * eff * math.hypot(point_noise(base), point_noise(top))
        low, high = eff - noise, eff + noise
    else:
        pairs = [t / (ratio * b) for t in runs_t for b in runs_b if b > 0]
        low, high = min(pairs), max(pairs)
        noise = max(eff - low, high - eff)
    loss = 1.0 - eff
    significant = math.isfinite(noise) and (high < 1.0 or low > 1.0)
    word = "significant" if significant else "inconclusive"
    cmd = ["trainscale", "doctor", "--nproc", str(top["nproc"]), *train_args] + (["--", *script] if script else [])
    lost = f"{loss:.0%} of ideal throughput lost" if loss >= 0 else f"{-loss:.0%} above ideal"
    if significant:
        advice = (f"next, ask why: {shlex.join(cmd)}" if loss > 0 else
                  "above 100%: smaller per-process work often runs faster (caches, threads); not a loss to fix")
    else:
        advice = "raise --repeat or --steps until the noise is smaller than the loss" + (
            f", or ask why directly: {shlex.join(cmd)}" if loss > 0 else "")
    noise_txt = f"± {noise:.0%}" if math.isfinite(noise) else "noise unknown"
    line = (f"Efficiency at {top['world_size']} processes: {eff:.0%} {noise_txt} ({lost}) — {word}"
            + (" (one run per point: noise from within each run only)" if one_run else "") + f"; {advice}.")
    return {"world_size": top["world_size"], "efficiency": eff, "noise": noise, "range": [low, high], "word": word,
            "doctor_command": shlex.join(cmd), "line": line}


def adopt_verdict(before: list[dict[str, Any]], after: list[dict[str, Any]], replicates: int = 300,
                  level: float = 0.90, seed: int = 0) -> dict[str, Any]:
    """'adopt' or 'do not adopt' a change, from the throughput of phased runs before and after it.

    ``before`` and ``after``: the same phase (the doctor's ``base``) of each repeat, with per-rank ``rank_steps``.
    The gain is the median samples/s after over the median before, minus 1. Its interval comes from a
    two-level bootstrap: repeats drawn with replacement (runs differ in placement), then each run's cycles
    (``bootstrap.throughput``). Adopt only when the whole interval is above zero.

    Example::

        v = adopt_verdict(base_parts, applied_parts)
        print(v["decision"], v["line"])
    """
    import random

    from .bootstrap import interval, throughput
    from .stats import median

    def gain(b: list[dict[str, Any]], a: list[dict[str, Any]], rng: random.Random | None = None) -> float:
        sps = lambda parts: median(throughput(p, rng) for p in parts)  # noqa: E731
        return sps(a) / sps(b) - 1

    rng = random.Random(seed)
    reps = [gain([rng.choice(before) for _ in before], [rng.choice(after) for _ in after], rng)
            for _ in range(replicates)]
    g = gain(before, after)
    lo, hi, _ = interval(reps, level)
    decision = "adopt" if lo > 0 else "do not adopt"
    why = ("faster by more than the measured noise" if lo > 0 else "slower, beyond the measured noise" if hi < 0
           else "the change is within the measured noise")
    line = (f"samples/s {g:+.1%} ({level:.0%} interval {lo:+.1%} .. {hi:+.1%}, {len(before)} runs before and "
            f"{len(after)} after, resampled by runs and cycles): {why}: {decision}")
    return {"decision": decision, "gain": g, "interval": [lo, hi], "line": line}
