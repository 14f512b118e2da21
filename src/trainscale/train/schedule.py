"""Learning rate as a pure function of the step (so resuming needs no scheduler state)."""

from __future__ import annotations

import math

from ..config import OptimConfig

__all__ = ["target_lr", "lr_at"]


def target_lr(cfg: OptimConfig, global_batch: int) -> float:
    """The rate after warmup: ``lr`` or, with linear scaling, ``lr * global_batch / base_batch`` (Goyal et al.)."""
    return cfg.lr * global_batch / cfg.base_batch if cfg.lr_scaling == "linear" else cfg.lr


def lr_at(step: int, cfg: OptimConfig, global_batch: int, total_steps: int) -> float:
    """Rate for optimizer step ``step`` (0-based).

    Gradual warmup ramps linearly over ``warmup_steps``: from ``lr`` to the scaled rate when linear
    scaling is on (Goyal et al.'s warmup), from ``lr / warmup_steps`` to ``lr`` otherwise.
    """
    peak = target_lr(cfg, global_batch)
    if cfg.warmup_steps and step < cfg.warmup_steps:
        frac = (step + 1) / cfg.warmup_steps
        start = cfg.lr if cfg.lr_scaling == "linear" and peak > cfg.lr else 0.0
        return start + (peak - start) * frac
    if cfg.schedule == "cosine":
        span = max(1, total_steps - cfg.warmup_steps)
        done = min(1.0, (step - cfg.warmup_steps) / span)
        return 0.5 * peak * (1 + math.cos(math.pi * done))
    return peak
