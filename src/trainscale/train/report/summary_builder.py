"""The summary builder: merges the reports of the strategy, the instruments and the loaders into the run summary.

A component of the run, given what it reads when it is called; it never calls back into the run. Every rank
calls ``build_summary`` (it gathers per-rank figures); the schema is ``summary.schema.json``.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ...about import versions
from ...config import Config, config_to_dict
from ...data import data_wait_advice
from ...distributed import DistEnv
from ...distributed.env import cluster_fields
from ...log import logger
from ..instruments import Instruments, RankStats, merge_accounting, merge_phase_stats, write_trace
from ..instruments.losses import LossWindow
from ..instruments.peak import bf16_native
from ..state import Prepared
from ..summary import SCHEMA_VERSION, median_interdecile

__all__ = ["RunRecord", "build_summary"]


@dataclass
class RunRecord:
    """What the run itself knows at its end: counts, where it resumed, how it ended."""

    steps: int
    start_step: int
    global_batch: int
    shards: int  # how many data shards the replicas read (world size, or a pipeline's replica count)
    started_at: str
    restarts: int
    steps_redone: int
    preempted: bool
    eval_result: tuple[float, float, int]
    out_dir: Path
    losses: LossWindow  # the loss's first and last windows, its curve, when the loop started
    loader: Any = None  # the first training loader: batch size, input rate, skipped samples
    metrics_jsonl: str | None = None
    flops: tuple[float, float] | None = None  # (the job's model FLOPs per optimizer step, its peak FLOP/s)
    peak_source: str | None = None  # where the peak comes from: the catalogue, or measured on this host
    extra: dict[str, Any] = field(default_factory=dict)


def build_summary(cfg: Config, env: DistEnv, parts: Prepared, rec: RunRecord) -> dict[str, Any]:
    """The run summary (collective: every rank calls it; the schema of ``trainscale train``).

    Example::

        summary = build_summary(cfg, env, Prepared(strategy, optimizer, instruments), record)
    """
    st, ins, optimizer, losses, loader = parts.strategy, parts.instruments, parts.optimizer, rec.losses, rec.loader
    first_last = st.share_loss(losses.first_last(env.device))  # every stage reports its last stage's loss
    dist.all_reduce(first_last)  # the loss over the global batch, not rank 0's share
    first_last /= env.world_size
    med, spread = median_interdecile(ins.step_times)
    total_t = sum(ins.step_times)
    per_rank: list[Any] = [None] * env.world_size  # every rank's RankStats
    dist.all_gather_object(per_rank, ins.local_stats())  # all-reduce equalises step times; compute shows who is slow
    wait_frac = (sum(ins.waits) / total_t) if total_t else float("nan")
    advice = data_wait_advice(wait_frac, cfg.data)
    if advice and env.is_main and not cfg.ablate.data:
        logger.warning(advice)
    a = cfg.ablate
    eval_loss, eval_acc, eval_n = rec.eval_result
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "versions": versions(), "started_at": rec.started_at,
        "host": socket.gethostname(), "world_size": env.world_size, **cluster_fields(env),
        "backend": env.backend, "device": env.device.type,
        "model": type(st.module).__name__, "data": "user",
        "batch_size": loader.batch_size if loader else cfg.data.batch_size, "grad_accum": cfg.strategy.grad_accum,
        "global_batch": rec.global_batch, "steps": rec.steps, "measured_steps": len(ins.step_times),
        "samples_per_s": len(ins.step_times) * rec.global_batch / total_t if total_t else float("nan"),
        "step_time_s": med, "step_time_spread": spread, "data_wait_frac": wait_frac,
        **_loader_fields(loader, env, rec.shards),
        "loss_first": first_last[0].item(), "loss_last": first_last[1].item(),
        "eval_loss": eval_loss, "eval_accuracy": eval_acc, "eval_samples": eval_n,
        "bucket_mb": cfg.strategy.bucket_mb, "overlap": cfg.strategy.overlap, "amp": cfg.strategy.amp,
        "bf16_native": bf16_native(env.device),
        "threads": env.threads, "ablate": {"comm": a.comm, "data": a.data, "compute": a.compute},
        **_rank_fields(per_rank, ins, rec.global_batch),
        "slow_rank": cfg.job.slow_rank, "slow_factor": cfg.job.slow_factor,
        "stragglers": [], "calibrated_compute_s": None,  # the monitor's and the sleep test's, when on (below)
        "restarts": rec.restarts, "steps_redone": rec.steps_redone,
        "resumed_from_step": rec.start_step, "preempted": rec.preempted,
        "wall_s": time.perf_counter() - losses.t_loop, "config": config_to_dict(cfg), "loss_curve": losses.curve,
        **_flops_fields(rec, med, a.compute == "sleep"),
        "strategy": {k: getattr(cfg.strategy, k) for k in ("hierarchical", "compression", "comm_groups",
                                                            "local_sgd_period", "local_sgd_warmup", "shard_optimizer")},
    }
    timeline = _write_timeline(ins, env, rec)
    if timeline:
        out["timeline"] = timeline
    if rec.metrics_jsonl:
        out["metrics_jsonl"] = rec.metrics_jsonl
    if optimizer is not None:
        out.update(st.report(optimizer, ins.warm, a.comm))
    out.update(ins.summary())  # the active instruments' fields and artefacts
    out.update(rec.extra)
    return out


def _flops_fields(rec: RunRecord, step_s: float, sleeping: bool) -> dict[str, Any]:
    """Model FLOPs per optimizer step (all ranks), achieved FLOP/s at the median step, and MFU against the peak."""
    if rec.flops is None:
        return {"flops_per_step": None, "flops_per_s": None, "peak_flops": None, "peak_flops_source": rec.peak_source,
                "mfu": None}
    per_step, peak = rec.flops
    achieved = per_step / step_s if step_s > 0 and not sleeping else float("nan")  # sleeping compute: no FLOPs
    return {"flops_per_step": per_step, "flops_per_s": achieved, "peak_flops": peak,
            "peak_flops_source": rec.peak_source, "mfu": achieved / peak}


def _loader_fields(loader: Any, env: DistEnv, shards: int) -> dict[str, Any]:
    """The slowest rank's input pipeline bounds the job: its rate x the shards; skipped samples summed (collective)."""
    rate = torch.tensor([float(loader.samples_per_s) if loader else float("nan")], device=env.device)
    dist.all_reduce(rate, op=dist.ReduceOp.MIN)
    skipped = torch.tensor([float(getattr(loader, "skipped", 0))], device=env.device)
    dist.all_reduce(skipped)
    return {"data_samples_per_s": rate.item() * shards, "data_skipped": int(skipped.item())}


def _rank_fields(per_rank: list[RankStats], ins: Instruments, global_batch: int) -> dict[str, Any]:
    """Per-rank compute, step, data wait and CPU, the paired experiments' phases and the time accounting,
    from every rank's ``local_stats``."""
    reports = [r.accounting for r in per_rank if r.accounting]
    acct = merge_accounting(reports) if len(reports) == len(per_rank) else None
    origin = reports[0]["origin"] if acct else 0.0  # rank 0's loop start: arrivals count from it
    return {
        "phases": merge_phase_stats([r.phases for r in per_rank], global_batch, origin) if ins.plan else None,
        "accounting": acct,
        "rank_compute_s": [r.compute_s for r in per_rank], "rank_compute_spread": [r.compute_spread for r in per_rank],
        "rank_step_time_s": [r.step_time_s for r in per_rank], "rank_data_wait_s": [r.data_wait_s for r in per_rank],
        "rank_cpu_s": [r.cpu_s for r in per_rank], "compute_s": per_rank[0].compute_s,
    }


def _write_timeline(ins: Instruments, env: DistEnv, rec: RunRecord) -> str:
    """Gather every rank's timeline rows; rank 0 writes timeline.json (collective when log.timeline)."""
    if ins.timeline is None:
        return ""
    rows: list[Any] = [None] * env.world_size
    dist.all_gather_object(rows, ins.timeline_rows())
    path = rec.out_dir / "timeline.json"
    if env.is_main:
        write_trace(path, rows, {"world_size": env.world_size, "backend": env.backend, "started_at": rec.started_at})
        logger.info(f"timeline of {len(rows[0])} steps x {len(rows)} ranks written to {path} "
                    "(open it in https://ui.perfetto.dev)")
    return str(path)
