"""Strategies: ``apply_*`` functions and DDP communication hooks, composed in ``apply_strategy``."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..config import StrategyConfig
from ..distributed import DistEnv
from ..log import logger
from .amp import apply_amp, check_amp
from .checks import check_strategy, check_transport
from .comm import CommMeter
from .ddp import allreduce_after_backward, apply_ddp, bucket_count, grad_buckets
from .fsdp import FsdpState, checkpoint_units, shard_units
from .layouts import Bare, Layout
from .layouts.ddp import ddp_layout
from .layouts.fsdp import fsdp_layout
from .layouts.pipeline import pipeline_layout
from .local_sgd import ModelAveraging
from .memory import PeakMemory
from .zero import apply_zero, optimizer_state_bytes, optimizer_state_dict

if TYPE_CHECKING:
    from .pipeline import Pipeline

__all__ = ["Strategy", "apply_strategy", "apply_ddp", "apply_amp", "check_amp", "bucket_count",
           "allreduce_after_backward", "grad_buckets", "check_strategy", "check_transport", "CommMeter",
           "apply_zero", "optimizer_state_bytes", "optimizer_state_dict", "Pipeline", "FsdpState", "PeakMemory",
           "Layout"]


def __getattr__(name: str) -> Any:
    if name == "Pipeline":  # imported on first use, as above
        from .pipeline import Pipeline
        return Pipeline
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Strategy:
    """A model ready to train and the named operations a step calls on it (Horovod's ``synchronize`` seam).

    Example::

        strategy = apply_strategy(model, env, cfg.strategy)
        strategy.set_grad_sync(last_micro_step)     # DDP exchanges gradients in this backward, or not
        loss = loss_fn(strategy.model(x), y); strategy.scaler.scale(loss).backward()
        strategy.sync_gradients()                   # overlap off: the exchange, after backward
        strategy.scaler.step(opt); strategy.scaler.update()
        strategy.after_optimizer_step()             # local SGD's model averaging
        strategy.end_step()                         # counters; bucket autotune may re-wrap the model
        strategy.finish(); strategy.report(opt, skip=3)

    Every layout-dependent operation is its ``layout``'s (``layouts/``: the bare module, DDP, FSDP2, pipeline
    stages), picked once by ``apply_strategy``: the strategy never asks which one it holds. Pipelined
    (``pipelined``), ``pipeline_step`` replaces forward and backward; the other operations answer for every layout.
    """

    def __init__(self, layout: Layout, autocast: Callable[[], AbstractContextManager], scaler: torch.amp.GradScaler,
                 meter: CommMeter, amp: bool = False):
        self.layout = layout
        self.autocast, self.scaler, self.meter = autocast, scaler, meter
        self.amp = amp  # mixed precision on: outputs are cast back to float32 for the loss
        params = list(layout.module.parameters())
        self.memory = PeakMemory(params[0].device if params else torch.device("cpu"))
        self.steps = 0

    @property
    def model(self) -> Any:
        """What a training forward runs through: DDP's wrapper, a pipeline stage, or ``module`` itself."""
        return self.layout.model

    @property
    def module(self) -> nn.Module:
        """The user's module: its parameters, state and attributes."""
        return self.layout.module

    @property
    def layout_name(self) -> str:
        """``bare`` (nothing exchanged), ``ddp``, ``fsdp`` or ``pipeline``: the summary's ``layout``."""
        return self.layout.name

    @property
    def averaging(self) -> ModelAveraging | None:
        """Local SGD's model averaging (each rank trains its own replica between averages); None without it."""
        return self.layout.averaging

    # ---- the step's operations
    def set_grad_sync(self, sync: bool, comm: bool = True) -> None:
        """Whether the next forward/backward exchanges gradients (DDP's ``no_sync`` is this flag; set before forward).

        ``comm`` False (the no-communication experiment) also stops DDP's buffer broadcast in forward.
        """
        self.layout.set_grad_sync(sync, comm)

    def no_sync(self) -> AbstractContextManager:
        """DDP's ``no_sync()`` (FSDP's without its reduce-scatter): backward inside it accumulates without an exchange.

        Correct under every data-parallel layout: with overlap off the exchange waits for ``sync_gradients``
        anyway, and hooks (compression, PowerSGD, local SGD) see the accumulated gradient on the synced
        backward, as with ``strategy.grad_accum``. A pipeline's schedule runs its own micro-batches: refused.
        """
        return self.layout.no_sync()

    @property
    def syncs_gradients(self) -> bool:
        """Whether the backward now running exchanges gradients (the last micro-step of an accumulation)."""
        return self.layout.syncs_gradients

    def backward_done(self) -> None:
        """Backward (and DDP's wait for its last bucket) returned: the meter notes the exposed wait."""
        self.meter.backward_done()

    def sync_gradients(self) -> int:
        """Overlap off: average the gradients now, after backward; returns the all-reduce calls (0 with overlap)."""
        return self.layout.sync_gradients()

    def pipeline_step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable[..., torch.Tensor],
                      optimizer: torch.optim.Optimizer | None) -> torch.Tensor | None:
        """Pipelined forward and backward of the batch's micro-batches; the mean loss on the last stage, else None."""
        return self.layout.pipeline_step(x, y, loss_fn, optimizer)

    @property
    def pipelined(self) -> bool:
        """Whether the model is cut into pipeline stages (train it through ``pipeline_step``)."""
        return self.layout.pipelined

    def compute_s(self) -> float:
        """Compute seconds the layout timed itself in the last step (a pipeline's stages); 0.0 elsewhere."""
        return self.layout.compute_s()

    def data_shard(self, rank: int, world: int) -> tuple[int, int]:
        """(which shard, of how many) of the training data this rank reads: a pipeline's stages share one."""
        return self.layout.data_shard(rank, world)

    def label_rows(self, rows: list[dict[str, Any]]) -> None:
        """Add each rank's pipeline stage and replica to the environment table's rows (nothing without a pipeline)."""
        self.layout.label_rows(rows)

    def share_loss(self, t: torch.Tensor) -> torch.Tensor:
        """Pipelined: the last stage's ``t`` on every stage of the replica (collective); else ``t`` as it is."""
        return self.layout.share_loss(t)

    def optimizer_state_dict(self, opt: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
        """The whole model's optimizer state for a one-file checkpoint (ZeRO, FSDP and pipelines gather it; collective)."""
        return self.layout.optimizer_state_dict(opt, rank)

    def load_optimizer_state_dict(self, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load ``optimizer_state_dict``'s whole-model state (FSDP: each rank keeps its shard of it)."""
        self.layout.load_optimizer_state_dict(opt, state)

    def model_state_dict(self) -> dict[str, Any]:
        """The whole model's state as plain tensors, for a one-file checkpoint (FSDP gathers its shards; collective)."""
        return self.layout.model_state_dict()

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        """Load a whole-model state (FSDP: each rank keeps its shard)."""
        self.layout.load_model_state_dict(state)

    def adopt_optimizer(self, opt: torch.optim.Optimizer | None) -> None:
        """The user's optimizer, built on the model before ``prepare``: FSDP points it at the sharded parameters."""
        self.layout.adopt_optimizer(opt)

    def clip_grad_norm(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale this rank's gradients so that the whole model's gradient norm is at most ``max_norm``.

        Equivalent to ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` on the unsplit model:
        after the exchange every replica holds the same averaged gradients, so each computes the same norm; a
        pipeline's stages hold disjoint parameters, so their partial norms are combined over the stage group.
        Returns the total norm before clipping.
        """
        return self.layout.clip_grad_norm(max_norm, norm_type)

    def gather_model(self) -> None:
        """Pipelined: every rank's ``module`` gets every stage's current weights (collective); else nothing."""
        self.layout.gather_model()

    def whole_model(self) -> AbstractContextManager:
        """Inside: ``module``'s forward needs no collective (FSDP: parameters kept gathered; pipeline: stages gathered).

        Collective on entry; evaluation with a different batch count per rank runs inside it.
        """
        return self.layout.whole_model()

    def after_optimizer_step(self) -> None:
        """After ``optimizer.step()`` and before ``zero_grad``: local SGD averages parameters every H steps."""
        self.layout.after_optimizer_step()

    def end_step(self) -> None:
        """Close the optimizer step: byte counters, and the bucket autotuner (it may re-wrap ``model``)."""
        self.steps += 1
        self.meter.end_step()
        self.layout.end_step()

    def finish(self) -> None:
        """After the last step: local SGD's replicas averaged, a pipeline's stages gathered, into one model (collective)."""
        self.layout.finish()

    def release(self) -> None:
        """End of the run: drop what holds a process group (DDP's reducer, hooks, averager, pipeline), keep ``module``.

        Called before the groups are destroyed (``distributed/teardown.py`` says why the order matters); the
        module runs bare from then on.
        """
        self.layout = self.layout.release()

    def calls_per_step(self) -> int:
        """All-reduce calls per step: the buckets exchanged after backward, or DDP's own buckets."""
        return self.layout.calls_per_step()

    # ---- state that must survive a restart
    def state_dict(self) -> dict[str, Any]:
        """Step counters of step-counting strategies (local SGD's warm-up and period)."""
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the counters: local SGD's hook and averager go on from the saved step."""
        self.steps = int(state["steps"])
        self.layout.load_steps(self.steps)

    def report(self, opt: torch.optim.Optimizer, skip: int, ablated: bool = False, calls: int | None = None
               ) -> dict[str, Any]:
        """The strategy's part of the run summary (collective: call on every rank)."""
        from .report import strategy_summary
        return strategy_summary(self, opt, skip, ablated, self.calls_per_step() if calls is None else calls)


def apply_strategy(model: nn.Module, env: DistEnv, cfg: StrategyConfig, layers: list[str] | None = None) -> Strategy:
    """The one place strategies are composed: device, precision, and the parallel layout, picked once.

    Pipeline stages (with DDP inside each stage's replicas; ``layers``: the model's layer names), FSDP2, DDP
    (fusion, overlap, comm hooks, local SGD, bucket autotune), or, with no one to exchange with, the bare module.

    Example::

        strategy = apply_strategy(model, env, cfg.strategy)
        strategy.layout_name    # 'bare' at world size 1, 'ddp' above
    """
    check_strategy(cfg, env.world_size, env.local_world_size)
    check_transport(cfg, env.device.type, env.backend)
    model = model.to(env.device)
    autocast, scaler = apply_amp(cfg.amp, env.device)
    meter = CommMeter()
    layout = _pick_layout(model, env, cfg, meter, autocast, layers)
    return Strategy(layout, autocast, scaler, meter, amp=cfg.amp != "none" or cfg.fsdp_param_dtype != "fp32")


def _pick_layout(model: nn.Module, env: DistEnv, cfg: StrategyConfig, meter: CommMeter,
                 autocast: Callable[[], AbstractContextManager], layers: list[str] | None) -> Layout:
    """Pipeline, FSDP2, DDP, or bare where there is no one to exchange gradients with (world size 1)."""
    if cfg.pipeline_stages > 1:  # one replica: its stages run without DDP (Pipeline._wrap)
        return pipeline_layout(model, env, cfg, autocast, meter, layers)
    if cfg.fsdp:
        return fsdp_layout(model, env, cfg, meter)
    if cfg.activation_checkpointing:
        checkpoint_units(shard_units(model, cfg.fsdp_modules))
    if env.world_size > 1:
        return ddp_layout(model, env, cfg, meter)
    return bare_layout(model, env, cfg, meter)


def bare_layout(model: nn.Module, env: DistEnv, cfg: StrategyConfig, meter: CommMeter) -> Bare:
    """World size 1: the module as it is; what would shape an exchange has nothing to act on (one log line)."""
    if env.device.type == "cpu":  # the accounting's backward tail is timed from the last gradient, as under DDP
        meter.watch_gradients(model)
    meter.fixed_bytes = 0.0
    idle = [f for f, on in (("compression", cfg.compression != "none"), ("hierarchical", cfg.hierarchical),
                            ("comm_groups", cfg.comm_groups > 1), ("local_sgd_period", cfg.local_sgd_period > 0),
                            ("bucket_mb", cfg.bucket_mb == "auto")) if on]
    if idle and env.is_main:
        logger.info(f"world size 1: the model runs bare and nothing is exchanged; no effect: strategy."
                    f"{', strategy.'.join(idle)}")
    return Bare(model, meter)
