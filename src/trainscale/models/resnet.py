"""ResNet-18/50 and SE-ResNeXt-50/101/152 with a configurable base width.

Written from the papers (He et al. 2016; Xie et al. 2017; Hu et al. 2018) so that no torchvision is
needed. Inputs smaller than 64 pixels get a 3x3 stem without max-pool (as CIFAR ResNets do), so
tiny CPU runs keep their spatial size.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from . import register


class SqueezeExcite(nn.Module):
    """Channel attention: global pool, bottleneck MLP, sigmoid gate."""

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        hidden = max(4, channels // reduction)
        self.fc1 = nn.Conv2d(channels, hidden, 1)
        self.fc2 = nn.Conv2d(hidden, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.fc2(torch.relu(self.fc1(s))))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int, **_: object):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.short = _shortcut(cin, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (grouped for ResNeXt), 1x1 expand, optional squeeze-excite."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, groups: int = 1, group_scale: int = 1, se: bool = False):
        super().__init__()
        mid = planes * group_scale
        groups = math.gcd(groups, mid)
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.se = SqueezeExcite(out) if se else nn.Identity()
        self.short = _shortcut(cin, out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.se(self.bn3(self.conv3(y)))
        return torch.relu(y + self.short(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """Stem, four stages of blocks, global pool, linear classifier."""

    def __init__(self, block: type[BasicBlock | Bottleneck], layers: list[int], in_shape: tuple[int, ...],
                 num_classes: int, width: int, **block_kw: Any):
        super().__init__()
        cin, size = in_shape[0], in_shape[-1]
        if size >= 64:
            self.stem = nn.Sequential(nn.Conv2d(cin, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        else:
            self.stem = nn.Sequential(nn.Conv2d(cin, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True))
        stages, c = [], width
        for i, n in enumerate(layers):
            planes = width * 2**i
            blocks = []
            for j in range(n):
                blocks.append(block(c, planes, 2 if (j == 0 and i > 0) else 1, **block_kw))
                c = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _pool_classify(self.head, self.stages(self.stem(x)))

    def pipeline_layers(self) -> list[tuple[str, nn.Module]]:
        """Where a pipeline may cut, in forward order: the stem, every block, the pooled classifier."""
        blocks = [(f"stages.{i}.{j}", b) for i, stage in enumerate(self.stages) for j, b in stage.named_children()]
        return [("stem", self.stem), *blocks, ("head", _PooledHead(self))]


class _PooledHead(nn.Module):
    """Global pool, flatten and the classifier as one module (the head's parameters stay the model's own)."""

    def __init__(self, net: ResNet):
        super().__init__()
        self.head = net.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _pool_classify(self.head, x)


def _pool_classify(head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _variant(name: str, block: type[BasicBlock | Bottleneck], layers: list[int], **block_kw: Any) -> None:
    @register(name)
    def build(in_shape: tuple[int, ...], num_classes: int, width: int = 0, depth: int = 0) -> nn.Module:
        return ResNet(block, layers, in_shape, num_classes, width or 64, **block_kw)

    build.__doc__ = f"{name} (base width default 64)"


_variant("resnet18", BasicBlock, [2, 2, 2, 2])
_variant("resnet50", Bottleneck, [3, 4, 6, 3])
# SE-ResNeXt 32x4d: the grouped 3x3 is twice the ResNet bottleneck width with 32 groups.
for _name, _layers in (("se_resnext50", [3, 4, 6, 3]), ("se_resnext101", [3, 4, 23, 3]),
                       ("se_resnext152", [3, 8, 36, 3])):
    _variant(_name, Bottleneck, _layers, groups=32, group_scale=2, se=True)
