"""Strategies: ``apply_*`` functions and DDP communication hooks, composed in ``apply_strategy``."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..config import StrategyConfig
from ..costs.collectives import collective_bytes
from ..distributed import DistEnv
from .amp import apply_amp, check_amp
from .autotune import BucketTuner, distinct_candidates
from .checks import check_strategy, check_transport, needs_hook
from .comm import CommMeter
from .ddp import allreduce_after_backward, apply_ddp, bucket_count, grad_buckets
from .fsdp import FsdpState, apply_fsdp, checkpoint_units, shard_units
from .hooks import CommHooks
from .local_sgd import ModelAveraging, apply_local_sgd
from .memory import PeakMemory
from .zero import apply_zero, optimizer_state_bytes, optimizer_state_dict

if TYPE_CHECKING:
    from .pipeline import Pipeline

__all__ = ["Strategy", "apply_strategy", "apply_ddp", "apply_amp", "check_amp", "bucket_count",
           "allreduce_after_backward", "grad_buckets", "check_strategy", "check_transport", "CommMeter",
           "apply_zero", "optimizer_state_bytes", "optimizer_state_dict", "Pipeline", "FsdpState", "PeakMemory"]


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

    Pipelined (``strategy.pipeline_stages`` > 1), ``pipeline_step`` replaces forward and backward; the
    operations below (data shard, loss sharing, clipping, optimizer state) answer for both layouts, so the
    run never branches on the layout. Under FSDP (``fsdp``) ``model`` is the sharded module itself and the same
    operations answer for its shards.
    """

    def __init__(self, model: nn.Module, module: nn.Module, autocast: Callable[[], AbstractContextManager],
                 scaler: torch.amp.GradScaler, meter: CommMeter, world: int, overlap: bool):
        self.model: Any = model  # DDP (or a pipeline stage): its sync flags are set per step
        self.module, self.autocast, self.scaler, self.meter = module, autocast, scaler, meter
        self.world, self.overlap = world, overlap
        self.amp = False  # mixed precision on: outputs are cast back to float32 for the loss
        self.post_backward: list[list[nn.Parameter]] = []  # overlap off: buckets exchanged after backward
        self.averaging: ModelAveraging | None = None
        self.tuner: BucketTuner | None = None
        self.hook_state: Any = None
        self.pipe: Pipeline | None = None
        self.fsdp: FsdpState | None = None
        self.memory = PeakMemory(next(module.parameters()).device if any(True for _ in module.parameters())
                                 else torch.device("cpu"))
        self.group: Any = None  # the process group gradients are averaged over (None: the world)
        self.steps = 0
        self._calls = 0  # all-reduce calls of the last step made by sync_gradients

    # ---- the step's operations
    def set_grad_sync(self, sync: bool, comm: bool = True) -> None:
        """Whether the next forward/backward exchanges gradients (DDP's ``no_sync`` is this flag; set before forward).

        ``comm`` False (the no-communication experiment) also stops DDP's buffer broadcast in forward.
        """
        if self.pipe is not None:  # the schedule turns DDP's sync on for the last micro-batch itself
            return
        if self.fsdp is not None:  # FSDP gathers parameters in forward whatever comm says (config refuses no_comm)
            self.fsdp.set_sync(sync)
            return
        self.model.require_backward_grad_sync = sync and self.overlap
        self.model.require_forward_param_sync = comm

    def no_sync(self) -> AbstractContextManager:
        """DDP's ``no_sync()`` (FSDP's without its reduce-scatter): backward inside it accumulates without an exchange.

        Correct under every data-parallel layout: with overlap off the exchange waits for ``sync_gradients``
        anyway, and hooks (compression, PowerSGD, local SGD) see the accumulated gradient on the synced
        backward, as with ``strategy.grad_accum``. A pipeline's schedule runs its own micro-batches: refused.
        """
        if self.pipe is not None:
            raise RuntimeError("no_sync() under a pipeline: the schedule accumulates its micro-batches itself; "
                               "use strategy.grad_accum and run.forward_backward instead")
        return self.fsdp.no_sync() if self.fsdp is not None else self.model.no_sync()

    @property
    def syncs_gradients(self) -> bool:
        """Whether the backward now running exchanges gradients (the last micro-step of an accumulation)."""
        return self.fsdp.sync if self.fsdp is not None else bool(self.model.require_backward_grad_sync)

    def backward_done(self) -> None:
        """Backward (and DDP's wait for its last bucket) returned: the meter notes the exposed wait."""
        self.meter.backward_done()

    def sync_gradients(self) -> int:
        """Overlap off: average the gradients now, after backward; returns the all-reduce calls (0 with overlap)."""
        if not self.post_backward:
            return 0
        t0 = time.perf_counter()
        self._calls = allreduce_after_backward(self.post_backward, self.world, self.group)
        self.meter.exposed(time.perf_counter() - t0)
        return self._calls

    def pipeline_step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable[..., torch.Tensor],
                      optimizer: torch.optim.Optimizer | None) -> torch.Tensor | None:
        """Pipelined forward and backward of the batch's micro-batches; the mean loss on the last stage, else None."""
        assert self.pipe is not None
        first = self.pipe.schedule is None
        loss = self.pipe.step(x, y, loss_fn, optimizer)
        if first:  # the stages exist now: what DDP synchronises on this rank
            own = self.pipe.own_parameters()
            self.model = self.pipe.stage_modules[0]
            if not self.overlap and self.pipe.replicas > 1:
                self.post_backward = grad_buckets(own, float(self.pipe.cfg.bucket_mb))
            wire = 0.5 if self.pipe.cfg.compression in ("fp16", "bf16") else 1.0
            self.meter.fixed_bytes = collective_bytes("all_reduce", wire * sum(q.numel() * q.element_size() for q in own),
                                                self.world)
        return loss

    @property
    def pipelined(self) -> bool:
        """Whether the model is cut into pipeline stages (train it through ``pipeline_step``)."""
        return self.pipe is not None

    def data_shard(self, rank: int, world: int) -> tuple[int, int]:
        """(which shard, of how many) of the training data this rank reads: a pipeline's stages share one."""
        return (self.pipe.replica, self.pipe.replicas) if self.pipe is not None else (rank, world)

    def label_rows(self, rows: list[dict[str, Any]]) -> None:
        """Add each rank's pipeline stage and replica to the environment table's rows (nothing without a pipeline)."""
        if self.pipe is not None:
            for r in rows:
                r["stage"], r["replica"] = r["rank"] % self.pipe.stages, r["rank"] // self.pipe.stages

    def share_loss(self, t: torch.Tensor) -> torch.Tensor:
        """Pipelined: the last stage's ``t`` on every stage of the replica (collective); else ``t`` as it is."""
        return self.pipe.share_loss(t) if self.pipe is not None else t

    def optimizer_state_dict(self, opt: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
        """The whole model's optimizer state for a one-file checkpoint (ZeRO, FSDP and pipelines gather it; collective)."""
        if self.fsdp is not None:
            return self.fsdp.full_optimizer_state(opt)
        return self.pipe.optimizer_state_dict(opt) if self.pipe is not None else optimizer_state_dict(opt, rank)

    def load_optimizer_state_dict(self, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load ``optimizer_state_dict``'s whole-model state (FSDP: each rank keeps its shard of it)."""
        opt.load_state_dict(state)
        if self.fsdp is not None:
            self.fsdp.shard_optimizer_state(opt)

    def model_state_dict(self) -> dict[str, Any]:
        """The whole model's state as plain tensors, for a one-file checkpoint (FSDP gathers its shards; collective)."""
        return self.fsdp.full_state_dict() if self.fsdp is not None else self.module.state_dict()

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        """Load a whole-model state (FSDP: each rank keeps its shard)."""
        if self.fsdp is not None:
            self.fsdp.load_full_state_dict(state)
        else:
            self.module.load_state_dict(state)

    def adopt_optimizer(self, opt: torch.optim.Optimizer | None) -> None:
        """The user's optimizer, built on the model before ``prepare``: FSDP points it at the sharded parameters."""
        if self.fsdp is not None:
            self.fsdp.rebind_optimizer(opt)

    def clip_grad_norm(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale this rank's gradients so that the whole model's gradient norm is at most ``max_norm``.

        Equivalent to ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` on the unsplit model:
        after the exchange every replica holds the same averaged gradients, so each computes the same norm; a
        pipeline's stages hold disjoint parameters, so their partial norms are combined over the stage group.
        Returns the total norm before clipping.
        """
        params = self.pipe.own_parameters() if self.pipe is not None else list(self.module.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, norm_type)
        if hasattr(norm, "full_tensor"):  # FSDP: the norm of this rank's shards; this all-reduces to the whole model's
            norm = norm.full_tensor()
        if self.pipe is not None and self.pipe.stages > 1:
            if norm_type == float("inf"):
                dist.all_reduce(norm, op=dist.ReduceOp.MAX, group=self.pipe.pp_group)
            else:
                norm = norm ** norm_type
                dist.all_reduce(norm, group=self.pipe.pp_group)
                norm = norm ** (1.0 / norm_type)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return norm

    def gather_model(self) -> None:
        """Pipelined: every rank's ``module`` gets every stage's current weights (collective); else nothing."""
        if self.pipe is not None:
            self.pipe.gather_model()

    def whole_model(self) -> AbstractContextManager:
        """Inside: ``module``'s forward needs no collective (FSDP: parameters kept gathered; pipeline: stages gathered).

        Collective on entry; evaluation with a different batch count per rank runs inside it.
        """
        self.gather_model()
        return self.fsdp.gathered() if self.fsdp is not None else contextlib.nullcontext()

    def after_optimizer_step(self) -> None:
        """After ``optimizer.step()`` and before ``zero_grad``: local SGD averages parameters every H steps."""
        if self.averaging is not None:
            self.averaging()

    def end_step(self) -> None:
        """Close the optimizer step: byte counters, and the bucket autotuner (it may re-wrap ``model``)."""
        self.steps += 1
        self.meter.end_step()
        if self.tuner is not None and self.tuner.active:
            self.tuner.after_step()

    def finish(self) -> None:
        """After the last step: local SGD's replicas averaged, a pipeline's stages gathered, into one model (collective)."""
        if self.averaging is not None:
            self.averaging.finish()
        if self.tuner is not None:
            self.tuner.finish()  # the autotuner's last trial closed, so report() only reads
        self.gather_model()

    def release(self) -> None:
        """End of the run: drop what holds a process group (DDP's reducer, hooks, averager, pipeline), keep ``module``.

        Called before the groups are destroyed (``distributed/teardown.py`` says why the order matters).
        """
        self.model = self.module
        self.tuner = self.hook_state = self.averaging = self.group = self.fsdp = None
        if self.pipe is not None:
            self.pipe.release()

    def calls_per_step(self) -> int:
        """All-reduce calls per step: the buckets exchanged after backward, or DDP's own buckets."""
        if self.post_backward:
            return len(self.post_backward)
        return bucket_count(self.model) if isinstance(self.model, DDP) else 0  # FSDP: no all-reduce

    # ---- state that must survive a restart
    def state_dict(self) -> dict[str, Any]:
        """Step counters of step-counting strategies (local SGD's warm-up and period)."""
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the counters: local SGD's hook and averager go on from the saved step."""
        self.steps = int(state["steps"])
        if hasattr(self.hook_state, "load_state_dict"):
            self.hook_state.load_state_dict({"steps": self.steps})
        if self.averaging is not None:
            self.averaging.load_state_dict({"step": self.steps})

    def report(self, opt: torch.optim.Optimizer, skip: int, ablated: bool = False, calls: int | None = None
               ) -> dict[str, Any]:
        """The strategy's part of the run summary (collective: call on every rank)."""
        from .report import strategy_summary
        out = strategy_summary(self, opt, skip, ablated, self.calls_per_step() if calls is None else calls)
        if self.pipe is not None and self.pipe.schedule is not None:
            out["pipeline"] = self.pipe.report(skip)
        return out




def apply_strategy(model: nn.Module, env: DistEnv, cfg: StrategyConfig, layers: list[str] | None = None) -> Strategy:
    """The one place strategies are composed: device, DDP (fusion, overlap, comm hooks), local SGD, precision,
    or pipeline stages with DDP inside each stage's replicas (``layers``: the model's layer names for a pipeline)."""
    check_strategy(cfg, env.world_size, env.local_world_size)
    check_transport(cfg, env.device.type, env.backend)
    model = model.to(env.device)
    autocast, scaler = apply_amp(cfg.amp, env.device)
    if cfg.pipeline_stages > 1:
        return apply_pipeline(model, env, cfg, autocast, scaler, layers)
    if cfg.fsdp:
        return apply_fsdp_strategy(model, env, cfg, autocast, scaler)
    if cfg.activation_checkpointing:
        checkpoint_units(shard_units(model, cfg.fsdp_modules))
    params = [p for p in model.parameters() if p.requires_grad]
    meter = CommMeter()
    if env.device.type == "cpu":  # exposed-communication timing is host time: meaningful on CPU only
        meter.watch_gradients(model)
    hooks = CommHooks(env, cfg, meter) if needs_hook(cfg) else None
    candidates = distinct_candidates(params, [float(c) for c in cfg.bucket_candidates.split(",")]) \
        if cfg.bucket_mb == "auto" else [float(cfg.bucket_mb)]
    ddp = apply_ddp(model, env, cfg, candidates[0])
    averaging = apply_local_sgd(model, env.world_size, cfg, meter)
    p = Strategy(ddp, model, autocast, scaler, meter, env.world_size, cfg.overlap)
    p.hook_state = hooks.register(ddp) if hooks else None
    p.averaging = averaging
    p.amp = cfg.amp != "none"
    # Without overlap, the gradients are exchanged by the trainer after backward, in these buckets.
    p.post_backward = [] if cfg.overlap else grad_buckets(params, candidates[0])
    if not p.hook_state:  # DDP's built-in all-reduce: the step's volume from the gradient sizes, no hook
        meter.fixed_bytes = collective_bytes("all_reduce", sum(q.numel() * q.element_size() for q in params),
                                       env.world_size)

    def rewrap(bucket_mb: float) -> None:
        # DDP cannot change its buckets: a new wrapper (its constructor re-broadcasts rank 0's weights,
        # equal already). The old one must go now: its reducer's autograd hooks leave with it.
        p.model = None
        gc.collect()
        p.model = apply_ddp(model, env, cfg, bucket_mb)
        p.hook_state = hooks.register(p.model) if hooks else None
        if not cfg.overlap:
            p.post_backward = grad_buckets(params, bucket_mb)

    if cfg.bucket_mb == "auto":
        p.tuner = BucketTuner(candidates, cfg.autotune_steps, rewrap, env.device)
    return p


def apply_fsdp_strategy(model: nn.Module, env: DistEnv, cfg: StrategyConfig,
                        autocast: Callable[[], AbstractContextManager], scaler: torch.amp.GradScaler) -> Strategy:
    """FSDP2: the model sharded in place; the strategy's ``model`` and ``module`` are the same sharded module."""
    fsdp = apply_fsdp(model, env, cfg)
    meter = CommMeter()  # no gradient hooks: FSDP sets the sharded gradients itself, after the reduce-scatter
    meter.fixed_bytes = fsdp.allgather_bytes + fsdp.reduce_scatter_bytes
    meter.blocked_is_exposed = True
    p = Strategy(model, model, autocast, scaler, meter, env.world_size, True)
    p.fsdp = fsdp
    p.amp = cfg.amp != "none" or cfg.fsdp_param_dtype != "fp32"
    return p


def apply_pipeline(model: nn.Module, env: DistEnv, cfg: StrategyConfig, autocast: Callable[[], AbstractContextManager],
                   scaler: torch.amp.GradScaler, layers: list[str] | None) -> Strategy:
    """Pipeline (x data) parallelism: the stages are cut at the first step; DDP averages over the replica group."""
    from .pipeline import Pipeline  # torch.distributed.pipelining costs ~2 s of import in every rank: only when used

    pipe = Pipeline(model, env, cfg, autocast, layers)
    p = Strategy(model, model, autocast, scaler, CommMeter(), pipe.replicas, cfg.overlap)
    p.pipe, p.group = pipe, pipe.dp_group
    p.amp = cfg.amp != "none"
    return p
