"""A user's own job for the parameter server: a model, a dataset without a DataInfo, and a loss.

Named on the command line as ``user_job:build``, ``user_job:data`` (this folder on PYTHONPATH), the way
``trainscale train`` takes them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

FEATURES, HIDDEN = 16, 24


def build(in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Two linear layers over float features: 16*24 + 24 + 24*C + C parameters."""
    return nn.Sequential(nn.Linear(in_shape[0], HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, num_classes))


def parameters(num_classes: int = 3) -> int:
    """How many parameters :func:`build` has (the test checks the job used this model)."""
    return FEATURES * HIDDEN + HIDDEN + HIDDEN * num_classes + num_classes


def data() -> tuple[TensorDataset, TensorDataset]:
    """Three Gaussian blobs in 16 dimensions, float32 inputs and int64 labels; no DataInfo (inferred)."""
    g = torch.Generator().manual_seed(7)
    centres = 2.0 * torch.randn(3, FEATURES, generator=g)

    def make(n: int) -> TensorDataset:
        y = torch.randint(0, 3, (n,), generator=g)
        return TensorDataset(centres[y] + torch.randn(n, FEATURES, generator=g), y)

    return make(1200), make(300)


def hinge(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A loss other than cross-entropy (multi-class hinge), for ``job.loss = user_job:hinge``."""
    return nn.functional.multi_margin_loss(output, target)
