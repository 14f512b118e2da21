"""A multi-layer perceptron over flattened inputs."""

from __future__ import annotations

import math

from torch import nn

from . import register


@register("mlp")
def mlp(in_shape: tuple[int, ...], num_classes: int, width: int = 0, depth: int = 2) -> nn.Module:
    """``depth`` hidden layers of ``width`` units (default 256) with ReLU."""
    width = width or 256
    layers: list[nn.Module] = [nn.Flatten()]
    fan_in = math.prod(in_shape)
    for _ in range(depth):
        layers += [nn.Linear(fan_in, width), nn.ReLU(inplace=True)]
        fan_in = width
    layers.append(nn.Linear(fan_in, num_classes))
    return nn.Sequential(*layers)
