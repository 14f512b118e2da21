"""Forecasts of published scaling results, each described as plain data (``tests/sim/heldout_scaling.json``).

A point names its setting (GPU, links, model size, one device's throughput or FLOPs) and the published
efficiency at ``world`` devices against ``baseline_world``. The forecast uses only that one-device figure and
datasheet numbers: ``ddp`` points go through ``forecast`` (buckets overlapped with backward, NCCL's ring),
``fsdp`` points through ``sim/fsdp.py``; both add the framework overhead of ``sim/overhead.py``.

Example::

    rows = evaluate(json.loads(Path("tests/sim/heldout_scaling.json").read_text())["points"])
    max(abs(r.error) for r in rows if r.role == "held_out")
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .fsdp import FsdpTimes, fsdp_step, half_allreduce, transformer_units
from .overhead import fit_overhead, fitted_overhead, precision_class

__all__ = ["Row", "efficiencies", "fsdp_times", "forecast_point", "fit_constants", "evaluate"]


@dataclass(frozen=True)
class Row:
    """One published point against its forecast (error = forecast - published, in efficiency points)."""

    id: str
    role: str
    published: float
    forecast: float
    known_gap: str = ""

    @property
    def error(self) -> float:
        return self.forecast - self.published


def _ddp(m: dict[str, Any], worlds: list[int]) -> dict[int, float]:
    """Data-parallel efficiency per world size, without the framework overhead."""
    from .forecast import ClusterSpec, Job, StrategySpec, forecast
    from .hardware import known_model
    from .step import profile_tensors
    from .units import parse_count, parse_number

    entry = known_model(m["model"]) if m.get("model") else None
    params = parse_count(m["params"], "params") if "params" in m else int(entry["params"]) if entry else 0
    if not params:
        raise ValueError(f"point without params or a catalogue model: {m}")
    tail = (entry["tail_params"], entry["tail_compute"]) if entry else (0.0, 0.0)
    tensors, costs = profile_tensors(params * 4.0, *tail)
    step = m["batch_size"] / parse_number(m["samples_per_s_1"], "samples_per_s_1")
    job = Job(m.get("model", "job"), params, m["batch_size"], step, step, tensor_bytes=tensors, tensor_costs=costs)
    cluster = ClusterSpec.from_catalog(m["gpu"], m["gpus_per_node"], m["intra"], m["inter"])
    strategy = StrategySpec(bucket_mb=float(m.get("bucket_mb", 25.0)), hierarchical=bool(m.get("hierarchical", False)))
    return {p.world_size: p.efficiency for p in forecast(job, cluster, strategy, worlds)}


def fsdp_times(m: dict[str, Any], world: int) -> FsdpTimes:
    """One FSDP step of the setting ``m`` at ``world`` devices (weak scaling: the same tokens per device)."""
    from .forecast import ClusterSpec
    from .hardware import gpu

    g = gpu(m["gpu"])
    linear_peak, other_peak = g.peak(m.get("linear_precision", m["precision"])), g.peak(m["precision"])
    per_token = m["linear_flops_per_token"] / linear_peak + m["attention_flops_per_token"] / other_peak
    compute = m["tokens_per_step"] * per_token / m["mfu"]
    head_share = m["head_flops_per_token"] / linear_peak / per_token
    cluster = ClusterSpec.from_catalog(m["gpu"], m["gpus_per_node"], m["intra"], m["inter"])

    units = transformer_units(m["layers"], m["layer_params"], compute, head_share)
    half = half_allreduce(cluster.allreduce_s, world)
    return fsdp_step(units, half, half, m.get("gather_bytes", 2), m.get("reduce_bytes", 4), m["root_params"])


def _fsdp(m: dict[str, Any], worlds: list[int]) -> dict[int, float]:
    """FSDP efficiency per world size, without the overhead."""
    return {w: (t := fsdp_times(m, w)).compute_s / t.step_s for w in worlds}


def efficiencies(m: dict[str, Any], worlds: list[int], kappa: float = 0.0) -> dict[int, float]:
    """Efficiency at each world size of the setting ``m``, with ``kappa`` x the 1-device step added at P > 1."""
    raw = {"ddp": _ddp, "fsdp": _fsdp}[m["kind"]](m, worlds)
    return {w: (e if w <= 1 else 1.0 / (1.0 / e + kappa)) for w, e in raw.items()}


def forecast_point(point: dict[str, Any], constants: dict[str, float] | None = None) -> float:
    """The forecast of one point's published quantity: efficiency at ``world`` over that at ``baseline_world``."""
    pub, m = point["published"], point["model"]
    kappa = (constants or {}).get(precision_class(m["precision"]), 0.0) if constants is not None else \
        fitted_overhead(m["precision"])
    worlds = sorted({pub["world"], pub.get("baseline_world", 1)})
    eff = efficiencies(m, worlds, kappa)
    base = pub.get("baseline_world", 1)
    return eff[pub["world"]] / (eff[base] if base > 1 else 1.0)


def fit_constants(points: Iterable[dict[str, Any]]) -> dict[str, float]:
    """The framework overhead per precision class, fitted on the points whose role is ``calibration`` only."""
    triples = []
    for p in points:
        if p["role"] != "calibration":
            continue
        if p["published"].get("baseline_world", 1) != 1:
            raise ValueError(f"{p['id']}: a calibration point is measured against one device")
        model = forecast_point(p, {})
        triples.append((p["model"]["precision"], p["published"]["efficiency"], model))
    return {c: round(v, 4) for c, v in fit_overhead(triples).items()}


def evaluate(points: Iterable[dict[str, Any]], constants: dict[str, float] | None = None) -> list[Row]:
    """Every point's published value against its forecast (``constants``: None reads the catalogue's)."""
    return [Row(p["id"], p["role"], p["published"]["efficiency"], forecast_point(p, constants), p.get("known_gap", ""))
            for p in points]
