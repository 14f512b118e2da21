"""Forecasts of published scaling results, each described as plain data (``tests/sim/heldout_scaling.json``).

A point names its setting (GPU, links, model size, one device's throughput or FLOPs) and the published
efficiency at ``world`` devices against ``baseline_world``. The forecast uses only that one-device figure and
datasheet numbers: ``ddp`` points go through ``forecast`` (buckets overlapped with backward or one all-reduce after
the accumulation, NCCL's ring), ``fsdp`` points through ``costs/fsdp.py``; both add the wait for the slowest rank
of ``costs/scale.py``, and where the source's throughput is an average over whole epochs (``epoch_samples``: its
code says so) the CPU time an epoch spends outside its steps, over the host's cores (``host_cores``). Those terms are
not stated by any source, so they are fitted, and scored honestly: leave one source out (fit on every other source,
forecast that one), for every source in turn.

Example::

    rows = leave_one_source_out(json.loads(Path("tests/sim/heldout_scaling.json").read_text())["points"])
    max(abs(r.error) for r in rows)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from .fsdp import fsdp_step, half_allreduce, transformer_units
from .scale import ScaleTerms, epoch_step_s

__all__ = ["Row", "Parts", "source_of", "parts", "forecast_point", "fit_terms", "leave_one_source_out", "evaluate"]

# The grid the terms are fitted on: spread (s/s), host jitter (seconds), reducer time (passes over the gradients),
# an epoch's time outside its steps (CPU seconds, spread over the host's cores).
SPREADS = [i * 0.005 for i in range(13)]
JITTERS = [i / 1000 for i in range(31)]  # i / 1000, not i * 0.001: 0.013, not 0.013000000000000001
REDUCER = [i * 2.0 for i in range(31)]
EPOCH_CPU = [i * 48.0 for i in range(13)]


@dataclass(frozen=True)
class Row:
    """One published point against its forecast (error = forecast - published, in efficiency points)."""

    id: str
    source: str
    published: float
    forecast: float
    terms: ScaleTerms
    scored: bool = True  # False: forecast and printed, not counted (the point says why)

    @property
    def error(self) -> float:
        return self.forecast - self.published


@dataclass(frozen=True)
class Parts:
    """One world size of a point without the noise terms: one device's step, the modelled step, the compute in it."""

    one_s: float
    step_s: float
    compute_s: float
    accumulation: int
    host_sync: bool
    pass_s: float = 0.0  # one pass over the gradient bytes the reducer handles, at memory bandwidth (0: none)
    epoch_steps: float = 0.0      # optimizer steps a rank takes in one measured epoch (0: the source times steps)
    one_epoch_steps: float = 0.0  # one device's measured epoch, in optimizer steps of this world's size
    host_cores: float = 0.0       # the CPU cores of the host the epoch's loader runs on

    def steady_s(self, world: int, terms: ScaleTerms) -> float:
        """The step at ``world`` with the wait for its slowest rank and DDP's own time."""
        wait = terms.wait_s(self.compute_s, world, self.host_sync, self.accumulation)
        return self.step_s + wait + terms.reducer_s(self.pass_s, world)

    def efficiency(self, world: int, terms: ScaleTerms) -> float:
        """One device's step over the step at ``world``, each with its share of an epoch's overhead where timed so."""
        c = terms.epoch_wall_s(self.host_cores)
        return epoch_step_s(self.one_s, self.one_epoch_steps, c) / epoch_step_s(self.steady_s(world, terms),
                                                                                 self.epoch_steps, c)


# Each point with its parts at its world and at its baseline world (None: one device).
Cached = Sequence[tuple[dict[str, Any], Parts, Parts | None]]


def source_of(point: dict[str, Any]) -> str:
    """A point's source: its URL without the fragment (one paper, one README, one benchmark file)."""
    return str(point["source"]["url"]).split("#")[0]


def _accumulation(m: dict[str, Any], world: int) -> int:
    acc = m.get("accumulation", {})
    return int(acc.get(str(world), 1))


def _ddp(m: dict[str, Any], world: int) -> Parts:
    """Data parallel at ``world``: one optimizer step of the accumulated micro-steps and its all-reduce."""
    from .forecast import ClusterSpec, Job, StrategySpec, forecast
    from .hardware import known_model
    from .step import profile_tensors
    from .units import parse_count, parse_number

    entry = known_model(m["model"]) if m.get("model") else None
    params = parse_count(m["params"], "params") if "params" in m else int(entry["params"]) if entry else 0
    if not params:
        raise ValueError(f"point without params or a catalogue model: {m}")
    tail = (entry["tail_params"], entry["tail_compute"]) if entry else (0.0, 0.0)
    grad_bytes = float(m.get("grad_bytes", 4))
    tensors, costs = profile_tensors(params * grad_bytes, *tail)
    acc = _accumulation(m, world)
    step = acc * m["batch_size"] / parse_number(m["samples_per_s_1"], "samples_per_s_1")
    job = Job(m.get("model", "job"), params, m["batch_size"] * acc, step, step, tensor_bytes=tensors,
              tensor_costs=costs, bytes_per_param=int(grad_bytes))
    cluster = ClusterSpec.from_catalog(m["gpu"], m["gpus_per_node"], m["intra"], m["inter"])
    cluster.nics_per_node = int(m.get("nics_per_node", 1))
    strategy = StrategySpec(bucket_mb=float(m.get("bucket_mb", 25.0)), overlap=bool(m.get("overlap", True)),
                            hierarchical=bool(m.get("hierarchical", False)))
    p = forecast(job, cluster, strategy, [world])[0]
    # gradient_as_bucket_view: nothing copied in or out; otherwise one pass over the gradients at memory bandwidth
    pass_s = 0.0 if m.get("bucket_view") else params * grad_bytes / (cluster.mem_gbs * 1e9)
    return Parts(step, p.step_time_s, step, acc, bool(m.get("host_sync", False)), pass_s, *_epochs(m, world, acc))


def _epochs(m: dict[str, Any], world: int, acc: int) -> tuple[float, float, float]:
    """(a rank's optimizer steps in one measured epoch at ``world``, one device's epoch in steps of ``acc`` micro-steps,
    the host's cores); zeros where the source times steps, not whole epochs of ``epoch_samples`` samples."""
    samples = int(m.get("epoch_samples", 0))
    if not samples:
        return 0.0, 0.0, 0.0
    if int(m.get("host_cores", 0)) < 1:
        raise ValueError(f"a point timed over epochs needs host_cores (the CPU cores of its host): {m}")
    b, one_acc = int(m["batch_size"]), _accumulation(m, 1)
    return float(samples // (world * b * acc)), float(samples // (b * one_acc) * one_acc / acc), float(m["host_cores"])


def _fsdp(m: dict[str, Any], world: int) -> Parts:
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
    t = fsdp_step(units, half, half, m.get("gather_bytes", 2), m.get("reduce_bytes", 4), m["root_params"])
    return Parts(t.compute_s, t.step_s, t.compute_s, 1, bool(m.get("host_sync", False)))


def parts(point: dict[str, Any]) -> tuple[Parts, Parts | None]:
    """(the point's world, its baseline world or None where the baseline is one device)."""
    m, pub = point["model"], point["published"]
    build = {"ddp": _ddp, "fsdp": _fsdp}[m["kind"]]
    base = pub.get("baseline_world", 1)
    return build(m, pub["world"]), (build(m, base) if base > 1 else None)


def _ratio(point: dict[str, Any], pw: Parts, pb: Parts | None, terms: ScaleTerms) -> float:
    pub = point["published"]
    eff = pw.efficiency(pub["world"], terms)
    return eff / pb.efficiency(pub["baseline_world"], terms) if pb else eff


def forecast_point(point: dict[str, Any], terms: ScaleTerms) -> float:
    """The forecast of one point's published quantity: efficiency at ``world`` over that at ``baseline_world``."""
    return _ratio(point, *parts(point), terms)


def _loss(cached: Cached, terms: ScaleTerms) -> float:
    """Mean over sources of each source's mean absolute error (every source weighs the same)."""
    by: dict[str, list[float]] = {}
    for p, pw, pb in cached:
        if not p.get("scored", True):
            continue
        by.setdefault(source_of(p), []).append(abs(_ratio(p, pw, pb, terms) - p["published"]["efficiency"]))
    return sum(sum(v) / len(v) for v in by.values()) / len(by)


def fit_terms(points: Iterable[dict[str, Any]]) -> ScaleTerms:
    """The terms that minimise the per-source mean absolute error over ``points`` (a grid search)."""
    cached = [(p, *parts(p)) for p in points]
    return _fit_cached(cached)



def _by_epoch(pw: Parts, pb: Parts | None) -> bool:
    """Whether the point's throughput is an average over whole epochs (its forecast depends on the epoch overhead)."""
    return pw.epoch_steps > 0 or (pb is not None and pb.epoch_steps > 0)


def _fit_cached(cached: Cached) -> ScaleTerms:
    """The grid point of least ``_loss``, ties to the smallest terms. Points timed over steps do not depend on the
    epoch overhead, so for each (spread, jitter, reducer) their errors are summed once and only the epoch-averaged
    points are evaluated at every overhead: the same minimum as the full grid, at a fraction of its cost."""
    scored = [c for c in cached if c[0].get("scored", True)]
    index = {src: i for i, src in enumerate(dict.fromkeys(source_of(c[0]) for c in scored))}
    counts = [0] * len(index)
    for c in scored:
        counts[index[source_of(c[0])]] += 1
    steps = [(index[source_of(c[0])], *c) for c in scored if not _by_epoch(c[1], c[2])]
    epochs = [(index[source_of(c[0])], *c) for c in scored if _by_epoch(c[1], c[2])]
    best: tuple[float, ...] | None = None
    for s, j, r in product(SPREADS, JITTERS, REDUCER):
        base = ScaleTerms(s, j, r)
        fixed = [0.0] * len(index)
        for i, p, pw, pb in steps:
            fixed[i] += abs(_ratio(p, pw, pb, base) - p["published"]["efficiency"])
        steady = [(i, p, pw, pb, pw.steady_s(p["published"]["world"], base),
                   pb.steady_s(p["published"]["baseline_world"], base) if pb else 0.0) for i, p, pw, pb in epochs]
        for overhead in EPOCH_CPU if epochs else [0.0]:
            errs = _epoch_errors(fixed, steady, overhead)
            key = (sum(e / n for e, n in zip(errs, counts)) / len(counts), s, j, r, overhead)
            best = key if best is None or key < best else best
    assert best is not None
    return ScaleTerms(*best[1:])


def _epoch_errors(fixed: list[float], steady: list[tuple[Any, ...]], cpu_s: float) -> list[float]:
    """``fixed`` (per source, summed absolute errors of points timed over steps) plus the epoch-averaged points'
    absolute errors at ``cpu_s`` CPU seconds an epoch outside its steps, their steady steps given."""
    errs = list(fixed)
    for i, p, pw, pb, sw, sb in steady:
        c = cpu_s / pw.host_cores
        eff = epoch_step_s(pw.one_s, pw.one_epoch_steps, c) / epoch_step_s(sw, pw.epoch_steps, c)
        if pb is not None:
            c = cpu_s / pb.host_cores
            eff /= epoch_step_s(pb.one_s, pb.one_epoch_steps, c) / epoch_step_s(sb, pb.epoch_steps, c)
        errs[i] += abs(eff - p["published"]["efficiency"])
    return errs


def leave_one_source_out(points: Sequence[dict[str, Any]], only: Iterable[str] | None = None) -> list[Row]:
    """Every point forecast with the terms fitted on every other source (its own source left out); with ``only``,
    the points of those sources alone (each fold still fitted on all the other sources)."""
    cached = [(p, *parts(p)) for p in points]
    rows = []
    wanted = set(only) if only is not None else None
    for src in dict.fromkeys(source_of(p) for p in points):
        if wanted is not None and src not in wanted:
            continue
        terms = _fit_cached([c for c in cached if source_of(c[0]) != src])
        rows += [Row(p["id"], src, p["published"]["efficiency"], _ratio(p, pw, pb, terms), terms, p.get("scored", True))
                 for p, pw, pb in cached if source_of(p) == src]
    return rows


def evaluate(points: Iterable[dict[str, Any]], terms: ScaleTerms) -> list[Row]:
    """Every point's published value against its forecast with the same ``terms`` (no source left out)."""
    return [Row(p["id"], source_of(p), p["published"]["efficiency"], forecast_point(p, terms), terms, p.get("scored", True))
            for p in points]
