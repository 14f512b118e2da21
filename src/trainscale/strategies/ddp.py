"""Synchronous data parallelism on DistributedDataParallel: fused buckets, overlap on or off."""

from __future__ import annotations

import inspect
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..config import ConfigError, StrategyConfig
from ..distributed import DistEnv

__all__ = ["apply_ddp", "allreduce_after_backward", "bucket_count", "grad_buckets", "is_compiled",
           "compiled_bucket_mb"]

_MB = 1024 * 1024
# DDP's first bucket: dynamo's DDPOptimizer refuses a bucket cap below it ("First bucket should be smaller/equal").
_FIRST_BUCKET = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", _MB)
_DDP_ARGS = inspect.signature(DDP.__init__).parameters


def apply_ddp(model: nn.Module, env: DistEnv, cfg: StrategyConfig, bucket_mb: float | None = None) -> DDP:
    """Wrap ``model`` in DDP with ``bucket_mb`` (default ``cfg.bucket_mb``) fused buckets (0: one per tensor)."""
    kw: dict = {"forward_sync_buffers": cfg.broadcast_buffers} if "forward_sync_buffers" in _DDP_ARGS \
        else {"broadcast_buffers": cfg.broadcast_buffers}  # renamed in torch 2.13
    return DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
               bucket_cap_mb=cfg.bucket_mb if bucket_mb is None else bucket_mb, gradient_as_bucket_view=True, **kw)


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` or one of its blocks went through ``torch.compile`` (the wrapper or ``module.compile()``)."""
    if "torch._dynamo" not in sys.modules:  # torch.compile imports it: nothing compiled, and no second of import here
        return False
    from torch._dynamo.eval_frame import OptimizedModule
    return any(isinstance(m, OptimizedModule) or getattr(m, "_compiled_call_impl", None) is not None
               for m in model.modules())


def compiled_bucket_mb(bucket_mb: float | str, candidates: list[float]) -> tuple[float, str | None]:
    """The one bucket size for a compiled model under DDP, and why autotuning keeps it (None: a size was given).

    Dynamo splits a compiled model's graph at DDP's buckets when it first runs under the wrapper (its
    DDPOptimizer), so the graphs follow the buckets; a new bucket size means a new wrapper and every graph
    compiled again, so ``auto`` keeps one size: the smallest candidate DDPOptimizer accepts, else DDP's 25 MB.
    """
    if bucket_mb != "auto":
        if float(bucket_mb) * _MB < _FIRST_BUCKET:
            raise ConfigError("strategy.bucket_mb", bucket_mb, "the model is compiled and dynamo splits its graph at "
                              f"DDP's buckets, which must hold at least {_FIRST_BUCKET / _MB:g} MB (DDP's first "
                              "bucket); give a larger size")
        return float(bucket_mb), None
    mb = next((c for c in candidates if c * _MB >= _FIRST_BUCKET), 25.0)
    return mb, (f"bucket autotune: the model is compiled, and dynamo splits its graph at DDP's buckets; another "
                f"size would re-wrap it and compile every graph again, so the buckets stay at {mb:g} MB")


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
