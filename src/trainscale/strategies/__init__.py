"""Strategies: ``apply_*`` functions and DDP communication hooks, composed in ``apply_strategy``."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from ..config import StrategyConfig
from ..dist import DistEnv
from .amp import apply_amp, check_amp
from .autotune import BucketTuner, distinct_candidates
from .checks import check_strategy, needs_hook
from .comm import CommMeter, ring_bytes
from .ddp import allreduce_after_backward, apply_ddp, bucket_count, grad_buckets
from .hooks import CommHooks
from .local_sgd import apply_local_sgd
from .zero import apply_zero, optimizer_state_bytes, optimizer_state_dict

__all__ = ["Prepared", "apply_strategy", "apply_ddp", "apply_amp", "check_amp", "bucket_count",
           "allreduce_after_backward", "grad_buckets", "check_strategy", "CommMeter", "ring_bytes",
           "apply_zero", "optimizer_state_bytes", "optimizer_state_dict"]


@dataclass
class Prepared:
    """A model ready to train: its wrapper, the unwrapped module and the step's helpers."""

    model: nn.Module
    module: nn.Module
    autocast: Callable[[], ContextManager]
    scaler: torch.amp.GradScaler
    post_backward: list[list[nn.Parameter]] = field(default_factory=list)
    meter: CommMeter = field(default_factory=CommMeter)
    post_step: Callable[[], None] | None = None  # after optimizer.step, before zero_grad (model averaging)
    post_train: Callable[[], None] | None = None  # after the last step, before evaluation and checkpoint
    tuner: BucketTuner | None = None
    hook_state: Any = None

    def resume_at(self, step: int) -> None:
        """After a checkpoint restore: step-counting strategy state (local SGD's warm-up, averaging) goes on."""
        inner = getattr(self.hook_state, "inner", None)
        if hasattr(inner, "start_localSGD_iter"):
            inner.iter = step
        if self.post_step is not None:
            self.post_step.averager.step = step  # type: ignore[attr-defined]


def apply_strategy(model: nn.Module, env: DistEnv, cfg: StrategyConfig) -> Prepared:
    """The one place strategies are composed: device, DDP (fusion, overlap, comm hooks), local SGD, precision."""
    check_strategy(cfg, env.world_size, env.local_world_size)
    model = model.to(env.device)
    autocast, scaler = apply_amp(cfg.amp, env.device)
    params = [p for p in model.parameters() if p.requires_grad]
    meter = CommMeter()
    if env.device.type == "cpu":  # exposed-communication timing is host time: meaningful on CPU only
        meter.watch_gradients(model)
    hooks = CommHooks(env, cfg, meter) if needs_hook(cfg) else None
    candidates = distinct_candidates(params, [float(c) for c in cfg.bucket_candidates.split(",")]) \
        if cfg.bucket_mb == "auto" else [float(cfg.bucket_mb)]
    ddp = apply_ddp(model, env, cfg, candidates[0])
    averaging = apply_local_sgd(model, env.world_size, cfg, meter)
    p = Prepared(model=ddp, module=model, autocast=autocast, scaler=scaler, meter=meter,
                 hook_state=hooks.register(ddp) if hooks else None, post_step=averaging,
                 post_train=averaging.finish if averaging else None)
    # Without overlap, the gradients are exchanged by the trainer after backward, in these buckets.
    p.post_backward = [] if cfg.overlap else grad_buckets(params, candidates[0])
    if not p.hook_state:  # DDP's built-in all-reduce: the step's volume from the gradient sizes, no hook
        meter.fixed_bytes = ring_bytes("all_reduce", sum(q.numel() * q.element_size() for q in params),
                                       env.world_size)

    def rewrap(bucket_mb: float) -> None:
        # DDP cannot change its buckets: a new wrapper (its constructor re-broadcasts rank 0's weights,
        # equal already). The old one must go now: its reducer's autograd hooks leave with it.
        p.model = None  # type: ignore[assignment]
        gc.collect()
        p.model = apply_ddp(model, env, cfg, bucket_mb)
        p.hook_state = hooks.register(p.model) if hooks else None
        if not cfg.overlap:
            p.post_backward = grad_buckets(params, bucket_mb)

    if cfg.bucket_mb == "auto":
        p.tuner = BucketTuner(candidates, cfg.autotune_steps, rewrap, env.device)
    return p
