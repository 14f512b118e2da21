"""The multi-process framework overhead: the share of a step that data-parallel runs lose beyond communication.

On one DGX node NVIDIA's DeepLearningExamples lose 3-6% of linear scaling in FP32/TF32 and 13-18% with mixed
precision, where the all-reduce of 100-200 MB over NVLink takes 1-3 ms of a 100-500 ms step and the overlap model
leaves under 0.3 ms of it exposed (benchmarks/plan_heldout.py). No datasheet gives that loss (the host's data
pipeline and kernel launches shared by 8 processes, the synchronisation of every step), so it is one constant per
precision class, fitted only on the calibration points of ``tests/sim/heldout_scaling.json`` and kept in
``catalog.json``. With it, a rank's step at P > 1 is the model's step plus ``kappa`` x the 1-device step, so
``1 / efficiency`` grows by ``kappa``.

Example::

    kappa = fitted_overhead("fp32")                  # the catalogue's constant for fp32/tf32
    points = with_overhead(forecast(job, cluster, StrategySpec(), [8, 64]), job.step_s, kappa)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..errors import ConfigError
from .forecast import Point
from .hardware import catalog

__all__ = ["CLASSES", "precision_class", "fitted_overhead", "with_overhead", "implied_overhead", "fit_overhead"]

# fp32 and tf32 run the step in full-width arithmetic; fp16/bf16 (AMP) and fp8 in reduced precision.
CLASSES = {"fp32": "full", "tf32": "full", "fp16": "mixed", "bf16": "mixed", "amp": "mixed", "fp8": "mixed"}


def precision_class(precision: str) -> str:
    """``full`` (fp32, tf32) or ``mixed`` (fp16, bf16, amp, fp8)."""
    if precision not in CLASSES:
        raise ConfigError("--precision", precision, "one of " + ", ".join(CLASSES))
    return CLASSES[precision]


def fitted_overhead(precision: str) -> float:
    """The catalogue's fitted overhead for ``precision``'s class (see ``framework_overhead`` in catalog.json)."""
    return float(catalog()["framework_overhead"][precision_class(precision)])


def with_overhead(points: list[Point], step_1_s: float, kappa: float) -> list[Point]:
    """``points`` with ``kappa`` x the 1-device step added to every step at more than one device."""
    if kappa < 0:
        raise ConfigError("--framework-overhead", kappa, "must be >= 0 (a share of the 1-device step)")
    out = []
    for p in points:
        if p.world_size <= 1 or not kappa:
            out.append(p)
            continue
        extra = kappa * step_1_s
        k = p.step_time_s / (p.step_time_s + extra)
        out.append(replace(p, step_time_s=p.step_time_s + extra, samples_per_s=p.samples_per_s * k,
                           speedup=p.speedup * k, efficiency=p.efficiency * k,
                           comm_overhead_s=p.comm_overhead_s + extra))
    return out


def implied_overhead(published_efficiency: float, model_efficiency: float) -> float:
    """The ``kappa`` that takes the model's efficiency (without overhead) to the published one."""
    return 1.0 / published_efficiency - 1.0 / model_efficiency


def fit_overhead(pairs: Iterable[tuple[str, float, float]]) -> dict[str, float]:
    """Per precision class, the mean implied overhead of (precision, published, model) calibration triples."""
    sums: dict[str, list[float]] = {}
    for precision, published, model in pairs:
        sums.setdefault(precision_class(precision), []).append(implied_overhead(published, model))
    return {c: sum(v) / len(v) for c, v in sums.items()}
