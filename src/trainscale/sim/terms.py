"""Every term of a forecast with its value, unit and source, for ``plan.json`` (``assumptions.terms``).

A term is a quantity a user can measure on their own job or read from a datasheet; its ``source`` says which:
given on the command line, measured by ``trainscale plan calibrate``, read from the catalogue's datasheet entries,
or assumed (the catalogue's value fitted on published sources, ``costs/catalog.json`` ``scale_terms``).

Example::

    terms = forecast_terms(job, cluster, strategy, given={"one_device_step_s": "--samples-per-s-1"})
    {t["name"]: t["unit"] for t in terms}
"""

from __future__ import annotations

from typing import Any

from ..costs.forecast import ClusterSpec, Job, StrategySpec
from ..costs.hardware import catalog, gpu
from ..costs.scale import ScaleTerms, with_extra

__all__ = ["forecast_terms", "with_scale_terms"]

# epoch_cpu_s is not among them: a forecast of one step has no epochs to spread it over.
SCALE_KEYS = ("spread", "host_jitter_s", "reducer_passes")


def _term(name: str, value: Any, unit: str, source: str) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "source": source}


def _job_terms(job: Job, measured: bool, given: dict[str, str]) -> list[dict[str, Any]]:
    how = "measured by trainscale plan calibrate" if measured else "given"
    reducer = []
    if job.reducer_cpu_s:  # a calibration measured it (sim/reducer.py)
        from .reducer import SOURCE

        reducer = [_term("reducer_cpu_s", round(job.reducer_cpu_s, 6), "CPU s per step, added at P > 1 only", SOURCE)]
    return reducer + [
        _term("one_device_step_s", round(job.step_s, 6), "s", given.get("one_device_step_s", how)),
        _term("compute_s", round(job.compute_s, 6), "s", given.get("one_device_step_s", how)),
        _term("backward_share", round(job.backward_share, 4), "s/s of compute",
              "assumed: backward ~ 2x forward (the 6N FLOPs rule, Kaplan et al. 2020)"),
        _term("params", job.params, "parameters", given.get("params", how)),
        _term("gradient_bytes", round(job.grad_bytes), "bytes", "params x bytes per gradient (fp32: 4)"),
        _term("batch_size", job.batch_size, "samples per device per step", given.get("batch_size", how)),
    ]


def _link_terms(cluster: ClusterSpec) -> list[dict[str, Any]]:
    nccl = catalog()["nccl"]["source"]
    out = [_term("gpus_per_node", cluster.gpus_per_node, "devices", "given (--gpus-per-node)"),
           _term("nics_per_node", cluster.nics_per_node, "adapters", "given (--nics-per-node, default 1)"),
           _term("base_latency_s", cluster.base_lat_s, "s per collective", nccl),
           _term("net_efficiency", cluster.net_efficiency, "s/s of line rate", "assumed: " + nccl)]
    for name, ln in (("intra", cluster.intra), ("inter", cluster.inter)):
        if ln is not None:
            out += [_term(f"{name}_bandwidth", ln.gbs * 1e9, "bytes/s per direction", ln.source or "given"),
                    _term(f"{name}_hop_latency_s", ln.hop_s, "s per hop", ln.source or "given")]
    if cluster.mem_gbs:
        out.append(_term("gpu_memory_bandwidth", cluster.mem_gbs * 1e9, "bytes/s", "the GPU's datasheet (--gpu)"))
    return out


def _strategy_terms(s: StrategySpec) -> list[dict[str, Any]]:
    out = [_term("bucket_bytes", s.bucket_mb * 1024 * 1024, "bytes", "given (--bucket-mb)"),
           _term("overlap", s.overlap, "yes/no", "given (--no-overlap)")]
    if s.fsdp_units:
        out += [_term("fsdp_units", s.fsdp_units, "units", "given (--fsdp-units)"),
                _term("fsdp_gather_bytes", s.fsdp_gather_bytes, "bytes per parameter", "given (--fsdp-gather-dtype)"),
                _term("fsdp_reduce_bytes", s.fsdp_reduce_bytes, "bytes per parameter", "given (--fsdp-reduce-dtype)")]
    return out


def forecast_terms(job: Job, cluster: ClusterSpec, strategy: StrategySpec, measured: bool = False,
                   given: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The job's, the cluster's and the strategy's terms, each ``{name, value, unit, source}``."""
    return _job_terms(job, measured, given or {}) + _link_terms(cluster) + _strategy_terms(strategy)


def _scale_terms(measured: dict[str, float], assumptions: dict[str, Any]) -> ScaleTerms:
    """The catalogue's fitted terms, each replaced by what ``plan calibrate`` measured where it did; every one
    recorded in ``assumptions`` (and its ``terms``) with its value, unit and source."""
    c = catalog()["scale_terms"]
    values = {}
    for key in SCALE_KEYS:
        got = measured.get(key)
        source = "measured by trainscale plan calibrate (this job, this host)" if got is not None else \
            "assumed: " + c["source"]
        values[key] = float(got if got is not None else c[key]["value"])
        assumptions[key] = {"value": values[key], "unit": c[key]["unit"], "what": c[key]["what"], "source": source,
                            "measure": c[key]["measure"]}
        assumptions.setdefault("terms", []).append({"name": key, **assumptions[key]})
    return ScaleTerms(values["spread"], values["host_jitter_s"], values["reducer_passes"])


def with_scale_terms(points: list[Any], job: Job, overhead: str | float, host_sync: bool, gpu_name: str | None,
                     fsdp_units: int, assumptions: dict[str, Any], measured: dict[str, float] | None = None) -> list[Any]:
    """``points`` with what a step loses beyond communication at P > 1 (``--framework-overhead``): a given share
    of the 1-device step, or with ``fitted`` the measurable terms of ``costs/scale.py`` (the slowest of P ranks,
    the reducer's time), measured where a calibration has them and the catalogue's otherwise."""
    if overhead != "fitted":
        kappa = float(overhead)
        if kappa:
            assumptions["framework_overhead"] = {"value": kappa, "unit": "s/s (share of the 1-device step at P > 1)",
                                                 "source": "given (--framework-overhead)"}
            assumptions.setdefault("terms", []).append({"name": "framework_overhead",
                                                        **assumptions["framework_overhead"]})
        return with_extra(points, lambda w: kappa * job.step_s)
    t = _scale_terms(measured or {}, assumptions)
    assumptions["host_sync"] = {"value": host_sync, "unit": "yes/no", "source": "given (--host-sync)"}
    assumptions["terms"].append({"name": "host_sync", **assumptions["host_sync"]})
    mem = gpu(gpu_name).mem_gbs * 1e9 if gpu_name else 0.0
    pass_s = job.grad_bytes / mem if mem and not fsdp_units else 0.0  # FSDP shards: no reducer buckets
    return with_extra(points, lambda w: t.wait_s(job.compute_s, w, host_sync) + t.reducer_s(pass_s, w))
