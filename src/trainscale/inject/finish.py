"""The end of an instrumented script's run: every rank's figures meet at rank 0 through the launcher's store
(not the script's process group, which the script may already have destroyed), and rank 0 writes the run
summary (``summary.schema.json``, the one ``jobs.read_summary`` reads) at ``TRAINSCALE_JSON``.

A run that never stepped an optimizer writes no summary but ``<summary>.why``: the one line the lab shows.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..about import versions
from ..config import config_to_dict
from ..reporting.stats import median_interdecile
from ..schema import SCHEMA_VERSION, write_summary
from ..train.instruments import merge_accounting, merge_phase_stats, write_trace
from .collectives import add_to_summary
from .fsdp import fsdp_facts

__all__ = ["connect_store", "finish_run", "backend_now", "NO_STEP"]

NO_STEP = ("the script never stepped an optimizer (no torch.optim step seen on rank 0), so it has no iterations "
           "to time: run a training loop, or put it on the run API -- add `run = trainscale.init()` before the "
           "loop and `run.finish()` after it")
GATHER_TIMEOUT_S = 60.0


def connect_store() -> Any:
    """A client of torchrun's agent store (it outlives every rank), or None outside torchrun."""
    import torch.distributed as dist

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not (addr and port):
        return None
    return dist.TCPStore(addr, int(port), is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=GATHER_TIMEOUT_S))


def _key(rank: int) -> str:
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    return f"trainscale/inject/{run}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/final/{rank}"


def finish_run(agent: Any) -> None:
    """Collect this rank's figures, hand them to rank 0, and on rank 0 write the summary."""
    ins = agent.ins
    if ins is None:
        if agent.rank == 0 and agent.json_path:
            step = agent.status.get("step", "measured")
            why = NO_STEP if step.startswith("measured") else (
                f"the optimizer step could not be reached ({step}): the script ran, observed only, with nothing timed")
            Path(agent.json_path + ".why").write_text(why + "\n")
        return
    ins.end_steps()
    ins.finish(agent.world)
    local = {"stats": ins.local_stats(), "loss": _losses(agent), "status": agent.status,
             "ddp": [_ddp_facts(d) for d in agent.ddps], "samples": _median(agent.samples[1:]),
             "micro": _median(agent.micro_counts[1:]), "threads": torch.get_num_threads(),
             "timeline": ins.timeline_rows(), "collectives": agent.collectives.local()}
    if agent.store is not None and agent.world > 1:
        agent.store.set(_key(agent.rank), pickle.dumps(local))
        if agent.rank != 0:
            return
        per_rank = [local] + [pickle.loads(agent.store.get(_key(r))) for r in range(1, agent.world)]
    else:
        per_rank = [local]
    if agent.rank == 0 and agent.json_path:
        summary = build_summary(agent, per_rank)
        add_to_summary(summary, [r.get("collectives") for r in per_rank])
        if not agent.status.get("backward", "").startswith("measured"):
            _compute_not_measured(summary)
        if ins.timeline is not None:
            path = agent.out_dir / "timeline.json"
            write_trace(path, [r["timeline"] for r in per_rank], {"world_size": agent.world, "backend": agent.backend,
                                                                  "started_at": summary["started_at"]})
            summary["timeline"] = str(path)
        write_summary(agent.json_path, summary)


def _setup(agent: Any, local: dict[str, Any]) -> dict[str, Any]:
    """What the job's setup costs or risks, as counted on rank 0 (the doctor turns these into causes)."""
    from ..about import available_cores

    n = max(1, agent.boundaries)
    return {"find_unused_walk_s_per_step": agent.walk_s / n if any(d.find_unused_parameters for d in agent.ddps)
            else None,
            "exchanges_per_step": _median(agent.sync_counts[1:]), "micro_batches_per_step": local["micro"],
            "host_syncs_per_step": _median(agent.sync_steps[2:]) if agent.status.get("host_syncs") == "measured"
            else None, "host_sync_sites": agent.syncs.top_sites(n), "one_rank_serves_data": agent.dispatched,
            "loader_workers": agent.workers, "evaluation_passes": agent.eval_passes, "threads": local["threads"],
            "processes_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", str(agent.world))), "cores": available_cores(),
            "cores_at_start": int(os.environ.get("TRAINSCALE_START_CPUS") or available_cores())}


def _compute_not_measured(summary: dict[str, Any]) -> None:
    """Without the backward hook the compute clock never stops: its figures are NaN ("not measured"), never 0."""
    nan = float("nan")
    summary["compute_s"] = nan
    for part in [summary, *(summary.get("phases") or {}).values()]:
        for key in ("rank_compute_s", "rank_compute_spread"):
            if key in part:
                part[key] = [nan] * len(part[key])
        for rows in part.get("rank_steps") or []:
            for row in rows:
                row[2] = nan  # STEP_ROW's compute column


def _median(values: list[int]) -> int:
    return int(statistics.median(values)) if values else 0


def _losses(agent: Any) -> tuple[float, float]:
    first, last = agent.loss_first, agent.loss_last
    return (float(first) if first is not None else float("nan"), float(last) if last is not None else float("nan"))


def _ddp_facts(ddp: Any) -> dict[str, Any]:
    """What DDP says of its own settings (its logging data where this PyTorch has it)."""
    facts: dict[str, Any] = {"find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
                             "bucket_bytes": getattr(ddp, "bucket_bytes_cap", None),
                             "static_graph": bool(getattr(ddp, "static_graph", False)),
                             "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
                             "broadcast_buffers": bool(getattr(ddp, "broadcast_buffers", True)),
                             "module": type(ddp.module).__name__}
    logging_data = getattr(ddp, "_get_ddp_logging_data", None)
    if callable(logging_data):
        try:
            data = logging_data()
            facts["logging_data"] = {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool))}
        except Exception as e:  # a private API: its absence is a fact, not a failure
            facts["logging_data"] = f"not available ({type(e).__name__})"
    else:
        facts["logging_data"] = "not available in this PyTorch"
    return {**facts, **_buckets(facts["logging_data"])}


def _buckets(data: Any) -> dict[str, Any]:
    """DDP's buckets as its logging data gives them: sizes (after its rebuild), gradient bytes, measured overlap.

    ``avg_backward_*`` are DDP's own timings of the iterations it samples (ns); None where this PyTorch lacks them.
    """
    if not isinstance(data, dict):
        return {"bucket_sizes_bytes": None, "gradient_bytes": None, "overlap_frac": None, "comm_s": None}
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    comm, both = data.get("avg_backward_comm_time"), data.get("avg_backward_compute_comm_overlap_time")
    timed = isinstance(comm, (int, float)) and comm > 0 and isinstance(both, (int, float))
    overlap = min(1.0, both / comm) if timed and comm and both is not None else None
    return {"bucket_sizes_bytes": [int(x) for x in sizes.split(",") if x.strip().isdigit()] if isinstance(sizes, str)
            else None,
            "gradient_bytes": data.get("total_parameter_size_bytes"),
            "overlap_frac": overlap, "comm_s": comm / 1e9 if timed and comm else None}


def build_summary(agent: Any, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The run summary from every rank's figures (rank 0's first); schema of ``trainscale train``'s."""
    ins, world = agent.ins, agent.world
    stats = [r["stats"] for r in per_rank]
    per_rank_batch = max(1, per_rank[0]["samples"])
    global_batch = per_rank_batch * world
    med, spread = median_interdecile(ins.step_times)
    total = sum(ins.step_times)
    reports = [s.accounting for s in stats]
    acct = merge_accounting(reports) if all(reports) else None
    origin = reports[0]["origin"] if acct else 0.0
    losses = [r["loss"] for r in per_rank]
    wall = time.perf_counter() - agent.t_start
    fw = agent.framework
    ddp = per_rank[0]["ddp"]
    setup = _setup(agent, per_rank[0])
    return {
        "schema_version": SCHEMA_VERSION, "versions": versions(),
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "world_size": world, "nodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        "procs_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", str(world))), "cluster_source": "torchrun",
        "backend": agent.backend, "device": str(ins.device.type),
        "model": ddp[0]["module"] if ddp else "user", "data": "user",
        "batch_size": per_rank_batch, "grad_accum": max(1, per_rank[0]["micro"]), "global_batch": global_batch,
        "steps": agent.boundaries, "measured_steps": len(ins.step_times),
        "samples_per_s": len(ins.step_times) * global_batch / total if total else float("nan"),
        "step_time_s": med, "step_time_spread": spread,
        "data_wait_frac": sum(ins.waits) / total if total else float("nan"),
        "loss_first": statistics.fmean(x[0] for x in losses), "loss_last": statistics.fmean(x[1] for x in losses),
        "bucket_mb": (ddp[0]["bucket_bytes"] or 0) / 2**20 if ddp else 0.0,
        "allreduce_calls_per_step": _calls(ddp, setup["exchanges_per_step"]),
        "threads": per_rank[0]["threads"],
        "ablate": {"comm": False, "data": False, "compute": "none"},
        "phases": merge_phase_stats([s.phases for s in stats], global_batch, origin) if ins.plan else None,
        "accounting": acct,
        "rank_compute_s": [s.compute_s for s in stats], "rank_compute_spread": [s.compute_spread for s in stats],
        "rank_step_time_s": [s.step_time_s for s in stats], "rank_data_wait_s": [s.data_wait_s for s in stats],
        "rank_cpu_s": [s.cpu_s for s in stats], "compute_s": stats[0].compute_s,
        "slow_rank": -1, "slow_factor": 1.0, "stragglers": [],
        "wall_s": wall, "config": config_to_dict(agent.cfg), "loss_curve": [],
        **ins.summary(),
        # FSDP's exposed wait measured (on CPU): the lab derives its no_comm from it (``terms.measured_exchange``)
        **({"fsdp": fsdp_facts(agent.fsdp_units, world, per_rank[0]["micro"])}
           if agent.fsdp_units and agent.meter is not None and agent.meter.blocked_is_exposed else {}),
        "injected": {"framework": fw, "setup": setup, "ddp": ddp, "measurements": per_rank[0]["status"],
                     "experiments_not_run": agent.phases_unrun, "argv": list(sys.argv)},
    }


def _calls(ddp: list[dict[str, Any]], exchanges: int) -> int | None:
    """All-reduce launches per optimizer step: one per bucket of each DDP instance and exchange (None: unknown)."""
    buckets = [d.get("bucket_sizes_bytes") for d in ddp]
    if not ddp or not all(buckets):
        return None
    return sum(len(b or []) for b in buckets) * max(1, exchanges)


def backend_now(device: torch.device) -> str:
    """The script's process-group backend (read while its group is up), else the device's default."""
    import torch.distributed as dist

    try:
        name = str(dist.get_backend()) if dist.is_initialized() else ""
    except Exception:  # a group of a kind this PyTorch does not name: the device's default
        name = ""
    return name if name in ("gloo", "nccl") else "nccl" if device.type == "cuda" else "gloo"
