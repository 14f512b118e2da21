"""Sharded optimizer state (ZeRO stage 1) on PyTorch's ``ZeroRedundancyOptimizer``."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

__all__ = ["apply_zero", "optimizer_state_bytes", "optimizer_state_dict"]


def apply_zero(opt: torch.optim.Optimizer) -> ZeroRedundancyOptimizer:
    """The same optimizer (class and settings), its state sharded across ranks; each rank updates its shard."""
    if len(opt.param_groups) != 1:
        raise ValueError("apply_zero expects an optimizer with one parameter group")
    return ZeroRedundancyOptimizer(opt.param_groups[0]["params"], optimizer_class=type(opt), **opt.defaults)


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of optimizer state (momentum, Adam moments) held by this rank."""
    local = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
    return sum(v.numel() * v.element_size() for s in local.state.values() for v in s.values() if torch.is_tensor(v))


def optimizer_state_dict(opt: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
    """The full optimizer state for a checkpoint (collective under ZeRO: call on every rank; rank 0 gets it)."""
    if isinstance(opt, ZeroRedundancyOptimizer):
        opt.consolidate_state_dict(to=0)
        return opt.state_dict() if rank == 0 else {}
    return opt.state_dict()
