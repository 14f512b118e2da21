"""Strategies: ``apply_*`` functions and DDP communication hooks, composed in ``apply_strategy``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch
from torch import nn

from ..config import StrategyConfig
from ..dist import DistEnv
from .amp import apply_amp, check_amp
from .ddp import allreduce_after_backward, apply_ddp, bucket_count, grad_buckets

__all__ = ["Prepared", "apply_strategy", "apply_ddp", "apply_amp", "check_amp", "bucket_count",
           "allreduce_after_backward", "grad_buckets"]


@dataclass
class Prepared:
    """A model ready to train: its wrapper, the unwrapped module and the step's helpers."""

    model: nn.Module
    module: nn.Module
    autocast: Callable[[], ContextManager]
    scaler: torch.amp.GradScaler
    post_backward: list[list[nn.Parameter]] = field(default_factory=list)


def apply_strategy(model: nn.Module, env: DistEnv, cfg: StrategyConfig) -> Prepared:
    """The one place strategies are composed: device, DDP (fusion, overlap), mixed precision."""
    model = model.to(env.device)
    autocast, scaler = apply_amp(cfg.amp, env.device)
    ddp = apply_ddp(model, env, cfg)
    # Without overlap, the gradients are exchanged by the trainer after backward, in these buckets.
    buckets = [] if cfg.overlap else grad_buckets([p for p in model.parameters() if p.requires_grad], cfg.bucket_mb)
    return Prepared(model=ddp, module=model, autocast=autocast, scaler=scaler, post_backward=buckets)
