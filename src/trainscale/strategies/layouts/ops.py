"""What several layouts do alike: clipping to the whole model's norm, the exchange after backward."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from ..comm import CommMeter
from ..ddp import allreduce_after_backward

__all__ = ["clip_norm", "exchange_after_backward"]


def clip_norm(params: list[nn.Parameter], max_norm: float, norm_type: float,
              group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Clip ``params``' gradients to a total norm of ``max_norm``; returns the norm before clipping.

    ``group``: ranks holding disjoint parts of the model (a pipeline's stages), whose partial norms combine
    into the whole model's. An FSDP shard's norm is made whole by its DTensor (``full_tensor``, collective).
    """
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], norm_type)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    if group is not None:
        if norm_type == float("inf"):
            dist.all_reduce(norm, op=dist.ReduceOp.MAX, group=group)
        else:
            norm = norm ** norm_type
            dist.all_reduce(norm, group=group)
            norm = norm ** (1.0 / norm_type)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def exchange_after_backward(buckets: list[list[nn.Parameter]], world: int, group: dist.ProcessGroup | None,
                            meter: CommMeter) -> int:
    """Overlap off: average the buckets' gradients now, timed as exposed communication; returns the calls."""
    if not buckets:
        return 0
    t0 = time.perf_counter()
    calls = allreduce_after_backward(buckets, world, group)
    meter.exposed(time.perf_counter() - t0)
    return calls
