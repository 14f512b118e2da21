"""``job.loss``: the loss of ``trainscale train`` and of parameter-server learners, by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..config import ConfigError

__all__ = ["LOSSES", "resolve_loss"]

LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "cross_entropy": nn.functional.cross_entropy, "mse": nn.functional.mse_loss, "l1": nn.functional.l1_loss}


def resolve_loss(name: str) -> Callable[[Any, Any], torch.Tensor]:
    """A built-in name or a user's ``package.module:function(output, target)`` returning a scalar tensor."""
    if ":" in name:
        from . import import_callable
        return import_callable(name, "job.loss")
    if name not in LOSSES:
        raise ConfigError("job.loss", name, "one of " + ", ".join(LOSSES) + ", or package.module:function")
    return LOSSES[name]
