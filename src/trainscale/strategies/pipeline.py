"""Pipeline and hybrid data x pipeline parallelism on ``torch.distributed.pipelining``.

The world is a 2-D mesh of replicas x stages (DDP over replicas of model-parallel stages): rank ``r`` runs stage ``r % S`` of
replica ``r // S``, so with 4 processes x 2 stages ranks 0 and 2 hold the first half and synchronise it
with DDP among themselves, ranks 1 and 3 the second. The schedules (GPipe, 1F1B, interleaved 1F1B,
zero-bubble V) are PyTorch's; this module only cuts the model, builds the stages and measures them.

Every rank holds the whole model object (its stages' layers are the ones it trains), so a checkpoint
is one whole-model state dict and resumes at any stage count, or as plain DDP.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from ..config import ConfigError, StrategyConfig
from ..distributed import DistEnv
from ..log import logger
from .layers import Layer, LayerCost, pipeline_layers, profile_layers
from .split import balanced_split, imbalance, named_split, stage_costs, uniform_split

__all__ = ["Pipeline", "chunk_ids", "bubble_theory"]

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B,
              "zbv": ScheduleZBVZeroBubble}


def chunk_ids(stage: int, stages: int, per_rank: int, schedule: str) -> list[int]:
    """The model chunks pipeline rank ``stage`` holds: looped (``stage``, ``stage + S``, ...) or V-shaped (zbv)."""
    if schedule == "zbv":
        return [stage, 2 * stages - 1 - stage]
    return [stage + k * stages for k in range(per_rank)]


def bubble_theory(stages: int, microbatches: int, schedule: str, per_rank: int) -> float | None:
    """The schedule's idle share from the planner's cost model; None where it has none (zbv)."""
    from ..costs.step import pipeline_bubble
    if schedule == "zbv":
        return None
    name = f"interleaved:{per_rank}" if schedule == "interleaved-1f1b" else schedule
    return pipeline_bubble(stages, microbatches, name)


class _TimedStage(PipelineStage):
    """A PipelineStage that adds up the host time of its own compute (forward, backward, weight gradients)."""

    busy = 0.0

    def _timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.busy += time.perf_counter() - t0

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super().forward_one_chunk, *args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super().backward_one_chunk, *args, **kwargs)

    def backward_weight_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super().backward_weight_one_chunk, *args, **kwargs)


class _Autocast(nn.Module):
    """bf16 autocast inside one stage; what crosses to the next stage is float32."""

    def __init__(self, inner: nn.Module, autocast: Callable[[], Any]):
        super().__init__()
        self.inner, self.autocast = inner, autocast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            out = self.inner(x)
        return out.float() if out.is_floating_point() else out


class Pipeline:
    """This rank's stage(s) of a replicas x stages mesh; built at the first step, with its real micro-batch.

    Example::

        pipe = Pipeline(model, env, cfg.strategy)
        loss = pipe.step(x, y, loss_fn)     # every micro-batch's forward and backward; the loss on the last stage
        optimizer.step()                    # this rank's parameters only have gradients
        pipe.gather_model()                 # every rank's model holds every stage's weights (eval, checkpoint)
    """

    def __init__(self, model: nn.Module, env: DistEnv, cfg: StrategyConfig, autocast: Callable[[], Any],
                 layer_names: list[str] | None = None):
        self.module, self.env, self.cfg, self.autocast = model, env, cfg, autocast
        self.stages = cfg.pipeline_stages
        self.replicas = env.world_size // self.stages
        self.stage, self.replica = env.rank % self.stages, env.rank // self.stages
        self.n_chunks = self.stages * cfg.stages_per_rank
        try:
            self.layers: list[Layer] = pipeline_layers(model, layer_names)
        except (TypeError, AttributeError) as e:
            raise ConfigError("strategy.pipeline_stages", self.stages, str(e)) from None
        if len(self.layers) < self.n_chunks:
            raise ConfigError("strategy.pipeline_stages", self.stages, f"more stages ({self.n_chunks} model chunks) "
                              f"than the model's {len(self.layers)} layers ({', '.join(layer.name for layer in self.layers)})")
        mesh = init_device_mesh(env.device.type, (self.replicas, self.stages), mesh_dim_names=("dp", "pp"))
        self.pp_group: Any = mesh["pp"].get_group()
        self.dp_group: Any = mesh["dp"].get_group()
        self.chunks = chunk_ids(self.stage, self.stages, cfg.stages_per_rank, cfg.schedule)
        self.holds_first, self.holds_last = 0 in self.chunks, self.n_chunks - 1 in self.chunks
        # the pipeline rank (= global rank in replica 0) that holds each chunk
        self.owner = {c: s for s in range(self.stages) for c in chunk_ids(s, self.stages, cfg.stages_per_rank,
                                                                         cfg.schedule)}
        self.starts: list[int] = []
        self.costs: list[LayerCost] = []
        self.stage_modules: list[nn.Module] = []  # this rank's chunks as DDP (replicas > 1) or plain modules
        self.schedule: Any = None
        self._stages: list[_TimedStage] = []
        self._loss_fn: Callable[..., torch.Tensor] | None = None
        self.step_s: list[float] = []  # per step: the schedule's wall time
        self.busy_s: list[float] = []  # per step: this rank's compute inside it
        self.stale = False  # other stages' weights changed since the last gather_model

    # ------------------------------------------------------------------ build
    def split_for(self, micro: torch.Tensor) -> tuple[list[int], list[LayerCost]]:
        """The chunks' first layers as ``strategy.split`` says, and the profile behind ``auto`` (rank 0 decides)."""
        how, names = self.cfg.split, [layer.name for layer in self.layers]
        choice: list[Any] = [None, []]
        if self.env.rank == 0:
            if how == "auto":
                costs = profile_layers(self.layers, micro)
                choice = [balanced_split([c.seconds for c in costs], self.n_chunks), costs]
            elif how == "uniform":
                choice[0] = uniform_split(len(names), self.n_chunks)
            elif how == "params":
                sizes = [float(sum(p.numel() for p in layer.module.parameters())) for layer in self.layers]
                choice[0] = balanced_split(sizes, self.n_chunks)
            else:
                try:
                    choice[0] = named_split(names, [n.strip() for n in how.split(",")], self.n_chunks)
                except ValueError as e:
                    choice = [str(e), []]
        if self.env.world_size > 1:
            dist.broadcast_object_list(choice, src=0)
        if isinstance(choice[0], str):
            raise ConfigError("strategy.split", how, choice[0])
        return choice[0], choice[1]

    def build(self, x: torch.Tensor, optimizer: torch.optim.Optimizer | None) -> None:
        """Cut the model, wrap this rank's chunks (DDP over the replica group) and make the schedule."""
        m = self.cfg.microbatches
        if x.shape[0] % m:
            raise ConfigError("strategy.microbatches", m, f"must divide the batch of {x.shape[0]} samples")
        self.starts, self.costs = self.split_for(x[: x.shape[0] // m])
        ends = self.starts[1:] + [len(self.layers)]
        for c in self.chunks:
            chunk = nn.Sequential(*(layer.module for layer in self.layers[self.starts[c]:ends[c]]))
            self.stage_modules.append(self._wrap(chunk))
        self._drop_foreign_state(optimizer)
        self._stages = [_TimedStage(mod, c, self.n_chunks, self.env.device, group=self.pp_group)
                        for c, mod in zip(self.chunks, self.stage_modules)]
        cls = _SCHEDULES[self.cfg.schedule]
        target = self._stages[0] if cls in (ScheduleGPipe, Schedule1F1B) else self._stages
        self.schedule = cls(target, m, loss_fn=self._loss)
        if self.env.is_main:
            logger.info(f"pipeline: {self.stages} stages x {self.replicas} replicas, {self.cfg.schedule}, {m} "
                        f"micro-batches; chunks start at {', '.join(self.layers[s].name for s in self.starts)}")

    def _wrap(self, chunk: nn.Module) -> nn.Module:
        mod = _Autocast(chunk, self.autocast) if self.cfg.amp != "none" else chunk
        if self.replicas == 1 or not self.cfg.overlap:  # overlap off: all-reduced after the step instead
            return mod
        ddp = DDP(mod, process_group=self.dp_group, bucket_cap_mb=float(self.cfg.bucket_mb),
                  device_ids=[self.env.device.index] if self.env.device.type == "cuda" else None)
        if self.cfg.compression in ("fp16", "bf16"):
            hook = default_hooks.fp16_compress_hook if self.cfg.compression == "fp16" else default_hooks.bf16_compress_hook
            ddp.register_comm_hook(self.dp_group, hook)
        return ddp

    def own_parameters(self) -> list[nn.Parameter]:
        """The parameters this rank trains (its chunks')."""
        return [p for mod in self.stage_modules for p in mod.parameters()]

    def _drop_foreign_state(self, optimizer: torch.optim.Optimizer | None) -> None:
        # Optimizer state of other stages' parameters (from a whole-model checkpoint) would go stale here.
        if optimizer is None:
            return
        own = {id(p) for p in self.own_parameters()}
        for p in [p for p in optimizer.state if id(p) not in own]:
            del optimizer.state[p]

    # ------------------------------------------------------------------ the step
    def _loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        assert self._loss_fn is not None
        return self._loss_fn(out, target)

    def step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable[..., torch.Tensor],
             optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor | None:
        """Forward and backward of every micro-batch through the schedule; the batch's mean loss on the last stage."""
        if self.schedule is None:
            self.build(x, optimizer)
        self._loss_fn = loss_fn
        losses: list[torch.Tensor] = []
        args = (x,) if self.holds_first else ()
        kwargs = {"target": y, "losses": losses} if self.holds_last else {}
        for s in self._stages:
            s.busy = 0.0
        t0 = time.perf_counter()
        self.schedule.step(*args, **kwargs)
        self.step_s.append(time.perf_counter() - t0)
        self.busy_s.append(sum(s.busy for s in self._stages))
        self.stale = True
        return torch.stack(losses).mean().detach() if losses else None

    def share_loss(self, t: torch.Tensor) -> torch.Tensor:
        """The last stage's value of ``t`` on every stage of this replica (collective over the stage group)."""
        dist.broadcast(t, group=self.pp_group, group_src=self.owner[self.n_chunks - 1])
        return t

    # ------------------------------------------------------------------ the whole model
    def gather_model(self) -> None:
        """Every rank's model gets every stage's current weights and buffers (collective; no-op when fresh)."""
        if not self.stale:
            return
        self.stale = False
        ends = self.starts[1:] + [len(self.layers)]
        for c in range(self.n_chunks):
            for layer in self.layers[self.starts[c]:ends[c]]:
                for t in layer.module.state_dict().values():
                    dist.broadcast(t, src=self.owner[c])  # replica 0's copy (all replicas agree after DDP)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The whole model's optimizer state on rank 0 (each stage's from its replica-0 rank; collective)."""
        sd = optimizer.state_dict()
        own = {id(p) for p in self.own_parameters()}
        index = [id(p) for g in optimizer.param_groups for p in g["params"]]
        mine = {i: {k: v.cpu() if torch.is_tensor(v) else v for k, v in s.items()}
                for i, s in sd["state"].items() if index[i] in own} if self.replica == 0 else {}
        parts: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(parts, mine)
        merged: dict[int, Any] = {}
        for part in parts:
            merged.update(part)
        return {"state": dict(sorted(merged.items())), "param_groups": sd["param_groups"]}

    def release(self) -> None:
        """End of the run: drop the schedule, the stages (DDP over the replica group) and the groups; keep ``module``."""
        self.schedule, self._stages, self.stage_modules = None, [], []
        self.pp_group = self.dp_group = None

    # ------------------------------------------------------------------ the summary
    def report(self, skip: int) -> dict[str, Any]:
        """The pipeline's part of the run summary: split, per-stage time, bubble measured and theoretical (collective)."""
        steps = list(zip(self.step_s, self.busy_s))[skip:] or list(zip(self.step_s, self.busy_s))
        step_s = statistics.median(s for s, _ in steps) if steps else float("nan")
        busy_s = statistics.median(b for _, b in steps) if steps else float("nan")
        rows: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(rows, (self.stage, self.replica, step_s, busy_s))
        per_stage = [statistics.mean(b for st, _, _, b in rows if st == s) for s in range(self.stages)]
        idle = [1 - b / t for _, _, t, b in rows if t > 0]
        names = [layer.name for layer in self.layers]
        ends = self.starts[1:] + [len(self.layers)]
        out: dict[str, Any] = {
            "stages": self.stages, "replicas": self.replicas, "microbatches": self.cfg.microbatches,
            "schedule": self.cfg.schedule, "stages_per_rank": self.cfg.stages_per_rank, "split": self.cfg.split,
            "layers": names, "boundaries": [names[s] for s in self.starts],
            "chunk_layers": [names[a:b] for a, b in zip(self.starts, ends)],
            "step_s": statistics.median(t for _, _, t, _ in rows), "stage_time_s": per_stage,
            "imbalance": imbalance(per_stage),
            "bubble_measured": statistics.mean(idle) if idle else float("nan"),
            "bubble_theory": bubble_theory(self.stages, self.cfg.microbatches, self.cfg.schedule,
                                           self.cfg.stages_per_rank),
        }
        if self.costs:  # split auto: what the profile measured and the balance it predicted
            out["layer_profile"] = [{"name": c.name, "seconds": c.seconds, "activation_bytes": c.activation_bytes,
                                     "param_bytes": c.param_bytes} for c in self.costs]
            out["profiled_imbalance"] = imbalance(stage_costs([c.seconds for c in self.costs], self.starts))
        return out
