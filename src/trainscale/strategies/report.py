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

__all__ = ["strategy_summary"]


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
    if s.local_sgd_period and p.post_step is not None:
        out["replica_max_diff"] = p.post_step.divergence  # type: ignore[attr-defined]  # before the final average
    return out
