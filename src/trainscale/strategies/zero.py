"""Sharded optimizer state (ZeRO stage 1) on PyTorch's ``ZeroRedundancyOptimizer``."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

__all__ = ["apply_zero", "optimizer_state_bytes", "optimizer_state_dict"]

# Imported only when used: torch.distributed.optim pulls in FSDP, seconds of start-up for every run.
_ZERO_MODULE = "torch.distributed.optim.zero_redundancy_optimizer"


def _is_zero(opt: torch.optim.Optimizer) -> bool:
    mod = sys.modules.get(_ZERO_MODULE)
    return mod is not None and isinstance(opt, mod.ZeroRedundancyOptimizer)


def apply_zero(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The same optimizer (class and settings), its state sharded across ranks; each rank updates its shard."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    # Every parameter group with its own settings (nanoGPT's AdamW: decay and no-decay groups); ZeRO partitions
    # each group's parameters across ranks. The constructor gets only the settings it takes: torch 2.13's AdamW
    # lists ``decoupled_weight_decay`` in its defaults but does not accept it back.
    accepted = inspect.signature(type(opt).__init__).parameters
    kw = {k: v for k, v in opt.defaults.items() if k in accepted}
    groups = [dict(g) for g in opt.param_groups]
    return ZeroRedundancyOptimizer(groups if len(groups) > 1 else groups[0]["params"], optimizer_class=type(opt), **kw)


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of optimizer state (momentum, Adam moments) held by this rank."""
    local = opt.optim if _is_zero(opt) else opt  # type: ignore[attr-defined]
    # A DTensor (FSDP) counts its global size; this rank holds its _local_tensor.
    held = [getattr(v, "_local_tensor", v) for s in local.state.values() for v in s.values() if torch.is_tensor(v)]
    return sum(v.numel() * v.element_size() for v in held)


def optimizer_state_dict(opt: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
    """The full optimizer state for a checkpoint (collective under ZeRO: call on every rank; rank 0 gets it)."""
    if _is_zero(opt):
        opt.consolidate_state_dict(to=0)  # type: ignore[attr-defined]
        return opt.state_dict() if rank == 0 else {}
    return opt.state_dict()
