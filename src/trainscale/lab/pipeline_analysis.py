"""The doctor's pipeline causes, as pure functions over run summaries: bubble and stage imbalance.

A pipelined job is not compared with 1 process (it cannot run there); it is compared with itself under
two changes, run alternately: twice the micro-batches (the bubble shrinks from (S-1)/(M+S-1)) and the
measured split (``strategy.split auto``). A cause is the step time that change saves; it is clear when
every repeat saves at least ``min_share`` of the step.

Example::

    experiments = pipeline_experiments(cfg)           # {"base": [], "more_microbatches": [...], ...}
    causes = pipeline_causes({name: [summary, ...] for name in experiments}, cfg)
"""

from __future__ import annotations

import statistics
from typing import Any

from ..config import Config

__all__ = ["pipeline_experiments", "pipeline_causes"]


def _more_microbatches(cfg: Config) -> int | None:
    """The smallest micro-batch count above the current one that divides the batch (None: there is none)."""
    m, batch = cfg.strategy.microbatches, cfg.data.batch_size
    divisors = [k for k in range(m + 1, batch + 1) if batch % k == 0]
    return next((k for k in divisors if k >= 2 * m), divisors[0] if divisors else None)


def pipeline_experiments(cfg: Config) -> dict[str, list[str]]:
    """The runs the doctor compares: the job as it is, and each change it can make."""
    out: dict[str, list[str]] = {"base": []}
    more = _more_microbatches(cfg)
    if more:
        out["more_microbatches"] = ["--strategy.microbatches", str(more)]
    if cfg.strategy.split != "auto":
        out["split_auto"] = ["--strategy.split", "auto"]
    return out


def _steps(runs: dict[str, list[dict[str, Any]]], name: str) -> list[float]:
    return [s["step_time_s"] for s in runs.get(name, [])]


def pipeline_causes(runs: dict[str, list[dict[str, Any]]], cfg: Config, min_share: float = 0.05
                    ) -> list[dict[str, Any]]:
    """``pipeline_bubble`` and ``stage_imbalance``: seconds per step saved, evidence, suggestion, verdict."""
    base = _steps(runs, "base")
    p0 = runs["base"][0]["pipeline"]
    t0 = statistics.median(base)
    causes: list[dict[str, Any]] = []
    for name, exp, flag in (("pipeline_bubble", "more_microbatches", "strategy.microbatches"),
                            ("stage_imbalance", "split_auto", "strategy.split")):
        other = _steps(runs, exp)
        if not other:
            continue
        saved = [b - o for b, o in zip(base, other)]
        p1 = runs[exp][0]["pipeline"]
        value = statistics.median(saved)
        if name == "pipeline_bubble":
            evidence = (f"idle {p0['bubble_measured']:.0%} of the step with {p0['microbatches']} micro-batches "
                        f"(theory {_pct(p0['bubble_theory'])}), {p1['bubble_measured']:.0%} with {p1['microbatches']} "
                        f"(theory {_pct(p1['bubble_theory'])}); step {t0 * 1e3:.1f} -> "
                        f"{statistics.median(other) * 1e3:.1f} ms")
            value_flag = str(p1["microbatches"])
            suggestion = f"--strategy.microbatches {value_flag}: smaller micro-batches keep every stage busy longer"
        else:
            evidence = (f"slowest / mean stage {p0['imbalance']:.2f} with split {p0['split']} (stages start at "
                        f"{', '.join(p0['boundaries'])}; stage times "
                        f"{', '.join(f'{t * 1e3:.1f}' for t in p0['stage_time_s'])} ms) vs {p1['imbalance']:.2f} "
                        f"measured-balanced (start at {', '.join(p1['boundaries'])}); step {t0 * 1e3:.1f} -> "
                        f"{statistics.median(other) * 1e3:.1f} ms")
            value_flag = "auto"
            suggestion = (f"--strategy.split auto (or --strategy.split {','.join(p1['boundaries'][1:])}): cut where "
                          "the measured layer times balance the stages")
        clear = all(s >= min_share * b for s, b in zip(saved, base))
        causes.append({"name": name, "seconds_per_step": value, "share": value / t0 if t0 else float("nan"),
                       "per_repeat_s": saved, "evidence": evidence, "suggestion": suggestion,
                       "apply_flags": {flag: value_flag},
                       "verdict": "clear" if clear else ("likely" if value > 0 else "no"), "significant": clear})
    causes.sort(key=lambda c: -c["seconds_per_step"])
    return causes


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"
