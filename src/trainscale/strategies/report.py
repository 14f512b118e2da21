"""The strategy's part of the run summary: communication volume and wait, optimizer memory, autotune choice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..config import Config
from .ddp import bucket_count
from .zero import optimizer_state_bytes

if TYPE_CHECKING:
    from . import Prepared

__all__ = ["strategy_summary", "replica_max_diff"]


def replica_max_diff(module: torch.nn.Module) -> float:
    """Largest difference of any parameter between ranks (collective; 0.0 when replicas are equal)."""
    worst = torch.zeros((), dtype=torch.float64)
    for q in module.parameters():
        hi, lo = q.detach().clone(), q.detach().clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        worst = torch.maximum(worst, (hi - lo).abs().max().double().cpu())
    return worst.item()


def strategy_summary(p: Prepared, opt: torch.optim.Optimizer, cfg: Config, calls: int) -> dict[str, Any]:
    """Fields added to (or refined in) the run summary; collective: call on every rank."""
    s = cfg.strategy
    out: dict[str, Any] = {}
    if p.tuner is not None:
        p.tuner.finish()
        out["bucket_autotune"] = p.tuner.report()
        out["bucket_mb"] = p.tuner.chosen
        if not cfg.ablate.comm:
            calls = len(p.post_backward) if p.post_backward else bucket_count(p.model)
    comm = p.meter.summary(cfg.log.skip_first, cfg.ablate.comm)
    out.update(comm)
    out["allreduce_calls_per_step"] = comm.pop("comm_calls_per_step", calls)
    out.pop("comm_calls_per_step", None)
    mem = torch.tensor([float(optimizer_state_bytes(opt))], device=next(p.module.parameters()).device)
    dist.all_reduce(mem, op=dist.ReduceOp.MAX)  # the fullest rank bounds the batch that fits
    out["optim_state_bytes"] = int(mem.item())
    out["strategy"] = {k: getattr(s, k) for k in ("hierarchical", "compression", "comm_groups", "local_sgd_period",
                                                  "local_sgd_warmup", "shard_optimizer")}
    if s.local_sgd_period:
        out["replica_max_diff"] = replica_max_diff(p.module)
    return out
