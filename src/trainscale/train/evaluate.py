"""Distributed evaluation whose global loss and accuracy are exact for any eval-set size."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["evaluate_batches"]


@torch.no_grad()
def evaluate_batches(module: nn.Module, batches: Iterable[Any], device: torch.device,
                     autocast: Callable[[], AbstractContextManager], loss_fn: Callable | None = None
                     ) -> tuple[float, float, int]:
    """(mean loss, accuracy or nan, samples) of ``(input, target)`` batches over every rank's shard, exactly.

    Shards are uneven (no padding), so each rank sums its own loss, hits and count, and one all-reduce of the
    sums gives the exact global figures; no collective runs per batch, so ranks with fewer batches cannot
    hang the others.

    ``loss_fn(output, target)`` returns the batch mean; it is weighted by the batch size, so the global
    mean is exact. Accuracy is counted when the output holds class scores for integer targets.
    """
    loss_fn = loss_fn or nn.functional.cross_entropy
    was_training = module.training
    module.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss x n, hits, n, n with accuracy
    for x, y in batches:
        with autocast():
            out = module(x)
        out = out.float() if torch.is_tensor(out) and out.is_floating_point() else out
        n = len(y)
        sums[0] += loss_fn(out, y).double() * n
        sums[2] += n
        if torch.is_tensor(out) and out.dim() == 2 and y.dim() == 1 and not y.is_floating_point():
            sums[1] += (out.argmax(1) == y).sum()
            sums[3] += n
    dist.all_reduce(sums)
    module.train(was_training)
    loss, hits, n, n_acc = sums.tolist()
    return (loss / n if n else float("nan")), (hits / n_acc if n_acc else float("nan")), int(n)
