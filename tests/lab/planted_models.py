"""Models for the doctor's planted-cause tests, loaded as ``--model.name planted_models:NAME``."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn


class SortWhenDistributed(nn.Module):
    """Sorts a scratch tensor every forward, a big one only when the world has more than one process:
    an operator that is slow only on many devices (seed 000's third hypothesis)."""

    def __init__(self, big: int = 400_000):
        super().__init__()
        self.big = big

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.big if dist.is_initialized() and dist.get_world_size() > 1 else 64
        scratch = torch.sort(torch.rand(n)).values
        return x + 0.0 * scratch[:1]


def slow_op_mlp(in_shape: tuple[int, ...], num_classes: int, width: int = 0) -> nn.Module:
    width = width or 64
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), width), nn.ReLU(),
                         SortWhenDistributed(), nn.Linear(width, num_classes))


def crash_when_distributed(in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if dist.is_initialized() and dist.get_world_size() > 1:
        raise RuntimeError("planted crash: this model refuses to run on several processes")
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(in_shape), num_classes))
