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
from ..costs.hardware import catalog

__all__ = ["forecast_terms"]


def _term(name: str, value: Any, unit: str, source: str) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "source": source}


def _job_terms(job: Job, measured: bool, given: dict[str, str]) -> list[dict[str, Any]]:
    how = "measured by trainscale plan calibrate" if measured else "given"
    return [
        _term("one_device_step_s", round(job.step_s, 6), "s", given.get("one_device_step_s", how)),
        _term("compute_s", round(job.compute_s, 6), "s", given.get("one_device_step_s", how)),
        _term("backward_share", round(job.backward_share, 4), "s/s of compute",
              "assumed: backward ~ 2x forward (the 6N FLOPs rule, Kaplan et al. 2020)"),
        _term("params", job.params, "parameters", given.get("params", how)),
        _term("gradient_bytes", round(job.grad_bytes), "bytes", "params x bytes per gradient (fp32: 4)"),
        _term("batch_size", job.batch_size, "samples per device per step", given.get("batch_size", how)),
        _term("spread", round(job.spread, 4), "s/s ((p90 - p10) / median of one device's compute)",
              "measured by trainscale plan calibrate" if measured else "0 unless measured (see scale_terms)"),
    ]


def _link_terms(cluster: ClusterSpec) -> list[dict[str, Any]]:
    nccl = catalog()["nccl"]["source"]
    out = [_term("gpus_per_node", cluster.gpus_per_node, "devices", "given (--gpus-per-node)"),
           _term("nics_per_node", cluster.nics_per_node, "adapters", "given (default 1)"),
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
