"""DDP: every rank a whole replica, gradients averaged in buckets (during backward, or after it with overlap off).

Comm hooks (compression, several communicators, hierarchical all-reduce, local SGD's warm-up) sit on the
wrapper; local SGD's model averaging runs after the optimizer step; ``bucket_mb auto`` re-wraps the module
with each candidate bucket size while it times them, except a compiled module, whose graphs dynamo splits at
the buckets: it keeps one size (``ddp.compiled_bucket_mb`` says which, and a log line why).
"""

from __future__ import annotations

import gc
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from torch import nn

from ...config import StrategyConfig
from ...costs.collectives import collective_bytes
from ...distributed import DistEnv
from ..autotune import BucketTuner, distinct_candidates
from ..checks import needs_hook
from ..comm import CommMeter
from ..ddp import apply_ddp, bucket_count, compiled_bucket_mb, grad_buckets, is_compiled
from ..hooks import CommHooks
from ..local_sgd import apply_local_sgd
from .bare import Bare
from .ops import exchange_after_backward

if TYPE_CHECKING:
    from .protocol import Layout

__all__ = ["DDPLayout", "ddp_layout"]


class DDPLayout(Bare):
    """The module wrapped in DDP (``model``), its hook, its after-backward buckets, local SGD and the bucket tuner.

    Example::

        layout = ddp_layout(model, env, cfg.strategy, CommMeter())
        layout.set_grad_sync(last_micro_step)   # DDP's require_backward_grad_sync
    """

    name = "ddp"

    def __init__(self, module: nn.Module, env: DistEnv, cfg: StrategyConfig, meter: CommMeter,
                 hooks: CommHooks | None, bucket_mb: float):
        super().__init__(module, meter)
        self.env, self.cfg, self.hooks = env, cfg, hooks
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.tuner: BucketTuner | None = None
        self.hook_state: Any = None
        self.post_backward: list[list[nn.Parameter]] = []  # overlap off: the buckets exchanged after backward
        self._wrap(bucket_mb)

    def _wrap(self, bucket_mb: float) -> None:
        self.model = apply_ddp(self.module, self.env, self.cfg, bucket_mb)
        self.hook_state = self.hooks.register(self.model) if self.hooks else None
        if not self.cfg.overlap:  # the gradients are exchanged by the step after backward, in these buckets
            self.post_backward = grad_buckets(self.params, bucket_mb)

    def rewrap(self, bucket_mb: float) -> None:
        """A new wrapper with ``bucket_mb`` buckets (the autotuner's next candidate)."""
        # DDP cannot change its buckets: a new wrapper (its constructor re-broadcasts rank 0's weights, equal
        # already). The old one must go first: its reducer's autograd hooks leave with it.
        self.model = None
        gc.collect()
        self._wrap(bucket_mb)

    def set_grad_sync(self, sync: bool, comm: bool = True) -> None:
        """DDP exchanges gradients in the next backward, or not; ``comm`` False also stops its buffer broadcast."""
        self.model.require_backward_grad_sync = sync and self.cfg.overlap
        self.model.require_forward_param_sync = comm

    def no_sync(self) -> AbstractContextManager:
        """DDP's own ``no_sync()`` (with overlap off the exchange waits for ``sync_gradients`` anyway)."""
        return self.model.no_sync()

    @property
    def syncs_gradients(self) -> bool:
        """Whether the backward now running exchanges gradients."""
        return bool(self.model.require_backward_grad_sync)

    def sync_gradients(self) -> int:
        """Overlap off: the exchange now, after backward; returns the all-reduce calls (0 with overlap)."""
        return exchange_after_backward(self.post_backward, self.env.world_size, None, self.meter)

    def after_optimizer_step(self) -> None:
        """Local SGD averages parameters every H steps."""
        if self.averaging is not None:
            self.averaging()

    def end_step(self) -> None:
        """The bucket autotuner counts the step (it may re-wrap ``model``)."""
        if self.tuner is not None and self.tuner.active:
            self.tuner.after_step()

    def finish(self) -> None:
        """Local SGD's replicas averaged into one model (collective); the autotuner's last trial closed."""
        if self.averaging is not None:
            self.averaging.finish()
        if self.tuner is not None:
            self.tuner.finish()

    def load_steps(self, steps: int) -> None:
        """Local SGD's hook and averager go on from the saved step."""
        if hasattr(self.hook_state, "load_state_dict"):
            self.hook_state.load_state_dict({"steps": steps})
        if self.averaging is not None:
            self.averaging.load_state_dict({"step": steps})

    def calls_per_step(self) -> int:
        """The buckets exchanged after backward, or DDP's own buckets."""
        return len(self.post_backward) if self.post_backward else bucket_count(self.model)

    def report(self, skip: int) -> dict[str, Any]:
        """The autotuner's trials and choice, local SGD's replica divergence before the final average."""
        out: dict[str, Any] = {}
        if self.tuner is not None:  # closed by finish()
            out["bucket_autotune"] = self.tuner.report()
            out["bucket_mb"] = self.tuner.chosen
        if self.averaging is not None:
            out["replica_max_diff"] = self.averaging.divergence
        return out

    def release(self) -> Layout:
        """Drop the wrapper's reducer, the hook, the averager and the tuner; the module runs bare from now."""
        self.model = self.module
        self.tuner = self.hook_state = self.averaging = None
        return Bare(self.module, self.meter)


def ddp_layout(model: nn.Module, env: DistEnv, cfg: StrategyConfig, meter: CommMeter) -> DDPLayout:
    """DDP with fused buckets, overlap on or off, the configured comm hook, local SGD and bucket autotuning."""
    params = [p for p in model.parameters() if p.requires_grad]
    if env.device.type == "cpu":  # exposed-communication timing is host time: meaningful on CPU only
        meter.watch_gradients(model)
    hooks = CommHooks(env, cfg, meter) if needs_hook(cfg) else None
    candidates = distinct_candidates(params, [float(c) for c in cfg.bucket_candidates.split(",")]) \
        if cfg.bucket_mb == "auto" else [float(cfg.bucket_mb)]
    why_one = None
    if is_compiled(model):  # a re-wrap would compile every graph again: one bucket size for the whole run
        size, why_one = compiled_bucket_mb(cfg.bucket_mb, candidates)
        candidates = [size]
    layout = DDPLayout(model, env, cfg, meter, hooks, candidates[0])
    layout.averaging = apply_local_sgd(model, env.world_size, cfg, meter)
    if not layout.hook_state:  # DDP's built-in all-reduce: the step's volume from the gradient sizes, no hook
        meter.fixed_bytes = collective_bytes("all_reduce", sum(q.numel() * q.element_size() for q in params),
                                             env.world_size)
    if cfg.bucket_mb == "auto":
        layout.tuner = BucketTuner(candidates, cfg.autotune_steps, layout.rewrap, env.device, why_one)
    return layout
