"""Models with planted, known compute for pipeline experiments: each layer sleeps for its share of the step.

A sleep holds no core, so on a small CPU machine the stages run side by side as they would on separate
devices, and a stage's time is what was planted (per sample, so a micro-batch of n samples costs n x).
Load them as ``--model.name trainscale.models.planted:balanced`` (or ``one_heavy``); ``model.depth`` is
the number of layers, ``model.width`` the planted forward microseconds per sample per layer (0: 250).

Example::

    trainscale train --nproc 2 --model.name trainscale.models.planted:one_heavy --model.depth 4 \\
        --strategy.pipeline_stages 2 --strategy.split auto
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

__all__ = ["SleepLinear", "balanced", "one_heavy"]

BACKWARD_FACTOR = 2.0  # backward costs about twice the forward (two matrix products instead of one)


class _Sleep(torch.autograd.Function):
    """Identity whose forward sleeps ``s`` seconds and whose backward sleeps ``BACKWARD_FACTOR`` x that."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, s: float) -> torch.Tensor:
        ctx.s = s
        time.sleep(s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.s * BACKWARD_FACTOR)
        return grad, None


class SleepLinear(nn.Module):
    """A linear layer with ReLU whose compute time is planted: ``us_per_sample`` microseconds per sample forward."""

    def __init__(self, fan_in: int, fan_out: int, us_per_sample: float, relu: bool = True):
        super().__init__()
        self.lin, self.relu, self.us = nn.Linear(fan_in, fan_out), relu, us_per_sample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _Sleep.apply(self.lin(x), self.us * 1e-6 * x.shape[0])
        return torch.relu(y) if self.relu else y


def _sleep_mlp(in_shape: tuple[int, ...], num_classes: int, costs: list[float], hidden: int = 32) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    fan_in = math.prod(in_shape)
    for i, us in enumerate(costs):
        last = i == len(costs) - 1
        layers.append(SleepLinear(fan_in, num_classes if last else hidden, us, relu=not last))
        fan_in = hidden
    return nn.Sequential(*layers)


def balanced(in_shape: tuple[int, ...], num_classes: int, width: int = 0, depth: int = 4) -> nn.Module:
    """``depth`` layers of equal planted cost."""
    return _sleep_mlp(in_shape, num_classes, [float(width or 250)] * depth)


def one_heavy(in_shape: tuple[int, ...], num_classes: int, width: int = 0, depth: int = 4) -> nn.Module:
    """``depth`` layers, the first 4x heavier than the others (a uniform split overloads the first stage)."""
    us = float(width or 250)
    return _sleep_mlp(in_shape, num_classes, [4 * us] + [us] * (depth - 1))
