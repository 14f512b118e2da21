"""A user's own data, model and loss for ``trainscale train`` (``module:function`` names): a regression."""

import torch
from torch.utils.data import TensorDataset

W = torch.tensor([[1.5], [-2.0], [0.5]])


def regression(cfg):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 3, generator=g)
    y = x @ W + 0.01 * torch.randn(512, 1, generator=g)
    return TensorDataset(x[:448], y[:448]), TensorDataset(x[448:], y[448:])


def linear(in_shape, num_classes):
    return torch.nn.Linear(in_shape[0], num_classes)


def per_sample_loss(out, target):
    return (out - target).pow(2)
