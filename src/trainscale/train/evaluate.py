"""Distributed evaluation whose global loss and accuracy are exact for any eval-set size."""

from __future__ import annotations

from typing import Callable, ContextManager, Iterable

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(module: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
             autocast: Callable[[], ContextManager]) -> tuple[float, float, int]:
    """Return (mean loss, accuracy, samples) over every rank's shard, each sample counted once.

    Shards are uneven (no padding), so each rank sums its own loss, hits and count, and one
    all-reduce of the three sums gives the exact global figures; no collective runs per batch, so
    ranks with fewer batches cannot hang the others.
    """
    was_training = module.training
    module.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for x, y in batches:
        with autocast():
            out = module(x)
        sums[0] += nn.functional.cross_entropy(out.float(), y, reduction="sum").double()
        sums[1] += (out.argmax(1) == y).sum()
        sums[2] += y.numel()
    dist.all_reduce(sums)
    module.train(was_training)
    loss, hits, n = sums.tolist()
    return (loss / n if n else float("nan")), (hits / n if n else float("nan")), int(n)
