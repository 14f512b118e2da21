"""Synchronous data parallelism on DistributedDataParallel: fused buckets, overlap on or off."""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..config import StrategyConfig
from ..distributed import DistEnv

__all__ = ["apply_ddp", "allreduce_after_backward", "bucket_count", "grad_buckets"]

_MB = 1024 * 1024
_DDP_ARGS = inspect.signature(DDP.__init__).parameters


def apply_ddp(model: nn.Module, env: DistEnv, cfg: StrategyConfig, bucket_mb: float | None = None) -> DDP:
    """Wrap ``model`` in DDP with ``bucket_mb`` (default ``cfg.bucket_mb``) fused buckets (0: one per tensor)."""
    kw: dict = {"forward_sync_buffers": cfg.broadcast_buffers} if "forward_sync_buffers" in _DDP_ARGS \
        else {"broadcast_buffers": cfg.broadcast_buffers}  # renamed in torch 2.13
    return DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
               bucket_cap_mb=cfg.bucket_mb if bucket_mb is None else bucket_mb, gradient_as_bucket_view=True, **kw)


def bucket_count(model: DDP) -> int:
    """All-reduce calls DDP's reducer makes per step: its bucket count, once it rebuilt them in step 2.

    DDP's logging data still lists the initial one-bucket layout at that point, so the reducer's
    current buckets are counted instead.
    """
    return len(model.reducer._get_zeros_like_grad_buckets())


def grad_buckets(params: list[nn.Parameter], bucket_mb: float) -> list[list[nn.Parameter]]:
    """Group parameters into buckets of at most ``bucket_mb`` MB, in reverse order as backward fills them."""
    cap = bucket_mb * _MB
    buckets: list[list[nn.Parameter]] = []
    size = cap  # forces a new bucket for the first tensor
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if size + nbytes > cap or not buckets:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return buckets


def allreduce_after_backward(buckets: list[list[nn.Parameter]], world: int,
                             group: dist.ProcessGroup | None = None) -> int:
    """Average gradients across ranks once backward has ended (no overlap); returns the calls made."""
    works, flats = [], []
    for bucket in buckets:
        grads = [p.grad for p in bucket if p.grad is not None]
        if not grads:
            continue
        flat = torch.cat([g.reshape(-1) for g in grads]) if len(grads) > 1 else grads[0].reshape(-1)
        flat.div_(world)
        works.append(dist.all_reduce(flat, group=group, async_op=True))
        flats.append((flat, grads))
    for w, (flat, grads) in zip(works, flats):
        w.wait()
        if len(grads) > 1:
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
    return len(works)
