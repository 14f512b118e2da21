"""Reductions over the job's ranks for a user's own loop (their evaluation, their metrics)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .errors import RunError

__all__ = ["all_reduce", "mean", "REDUCE_OPS"]

# Gloo has no AVG: "mean" is a SUM divided by the world size, the same on every backend.
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
              "product": dist.ReduceOp.PRODUCT, "mean": dist.ReduceOp.SUM}


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce ``tensor`` in place over every rank (collective) and return it; ``op``: sum, mean, max, min, product.

    Example::

        n = run.all_reduce(torch.tensor([correct, total], device=run.device))   # both summed over ranks
    """
    if op not in REDUCE_OPS:
        raise RunError(f"run.all_reduce: op = {op!r}: must be one of {', '.join(REDUCE_OPS)}")
    if not torch.is_tensor(tensor):
        raise RunError(f"run.all_reduce: expects a tensor, got {type(tensor).__name__}; use run.mean(x) for a number")
    if op == "mean" and not tensor.is_floating_point():
        raise RunError(f"run.all_reduce: op 'mean' needs a floating-point tensor, got {tensor.dtype}")
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=REDUCE_OPS[op])
        if op == "mean":
            tensor /= dist.get_world_size()
    return tensor


def mean(value: torch.Tensor | float, device: torch.device | None = None) -> torch.Tensor:
    """The mean of ``value`` over every rank (collective), as a new float tensor; ``value`` is left unchanged.

    Example::

        val_loss = run.mean(torch.stack(losses).mean())   # this rank's mean, then the mean of the ranks' means
    """
    t = value.detach().clone() if torch.is_tensor(value) else torch.tensor(float(value), device=device)
    return all_reduce(t if t.is_floating_point() else t.double(), "mean")
