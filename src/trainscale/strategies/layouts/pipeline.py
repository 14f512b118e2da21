"""Pipeline stages (x data-parallel replicas): the schedule runs forward and backward; DDP inside each stage.

Every rank holds the whole model object and trains its stages' layers; the stages are cut at the first step,
with its real micro-batch. The replicas of one stage read one data shard together; the last stage's loss is
shared with the others; a norm or a whole model combines the stages (collective).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ...config import StrategyConfig
from ...costs.collectives import collective_bytes
from ...distributed import DistEnv
from ..comm import CommMeter
from ..ddp import bucket_count, grad_buckets
from .bare import Bare
from .ops import clip_norm, exchange_after_backward

if TYPE_CHECKING:
    from ..pipeline import Pipeline
    from .protocol import Layout

__all__ = ["PipelineLayout", "pipeline_layout"]


class PipelineLayout(Bare):
    """This rank's stages of a replicas x stages mesh (``Pipeline``); ``model`` is its first stage once cut.

    Example::

        layout = pipeline_layout(model, env, cfg.strategy, autocast, CommMeter(), layers=None)
        loss = layout.pipeline_step(x, y, loss_fn, optimizer)   # every micro-batch; the loss on the last stage
    """

    name = "pipeline"
    pipelined = True

    def __init__(self, module: nn.Module, meter: CommMeter, pipe: Pipeline, cfg: StrategyConfig):
        super().__init__(module, meter)
        self.pipe, self.cfg = pipe, cfg
        self.post_backward: list[list[nn.Parameter]] = []  # overlap off: the buckets exchanged after the schedule

    def set_grad_sync(self, sync: bool, comm: bool = True) -> None:
        """The schedule turns DDP's sync on for the last micro-batch itself."""

    def no_sync(self) -> AbstractContextManager:
        """Refused: the schedule accumulates its micro-batches itself."""
        raise RuntimeError("no_sync() under a pipeline: the schedule accumulates its micro-batches itself; "
                           "use strategy.grad_accum and run.forward_backward instead")

    def sync_gradients(self) -> int:
        """Overlap off: average this rank's stage gradients over the replica group now."""
        return exchange_after_backward(self.post_backward, self.pipe.replicas, self.pipe.dp_group, self.meter)

    def pipeline_step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable[..., torch.Tensor],
                      optimizer: torch.optim.Optimizer | None) -> torch.Tensor | None:
        """Pipelined forward and backward of the batch's micro-batches; the mean loss on the last stage, else None."""
        first = self.pipe.schedule is None
        loss = self.pipe.step(x, y, loss_fn, optimizer)
        if first:  # the stages exist now: what DDP synchronises on this rank
            own = self.pipe.own_parameters()
            self.model = self.pipe.stage_modules[0]
            if not self.cfg.overlap and self.pipe.replicas > 1:
                self.post_backward = grad_buckets(own, float(self.cfg.bucket_mb))
            wire = 0.5 if self.cfg.compression in ("fp16", "bf16") else 1.0
            self.meter.fixed_bytes = collective_bytes(
                "all_reduce", wire * sum(q.numel() * q.element_size() for q in own), self.pipe.replicas)
        return loss

    def compute_s(self) -> float:
        """This rank's compute inside the last schedule step, as its stages timed it."""
        return self.pipe.busy_s[-1]

    def data_shard(self, rank: int, world: int) -> tuple[int, int]:
        """The stages of one replica share its shard."""
        return self.pipe.replica, self.pipe.replicas

    def label_rows(self, rows: list[dict[str, Any]]) -> None:
        """Each rank's stage and replica, for the environment table."""
        for r in rows:
            r["stage"], r["replica"] = r["rank"] % self.pipe.stages, r["rank"] // self.pipe.stages

    def share_loss(self, t: torch.Tensor) -> torch.Tensor:
        """The last stage's ``t`` on every stage of the replica (collective)."""
        return self.pipe.share_loss(t)

    def optimizer_state_dict(self, opt: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
        """The whole model's optimizer state, each stage's from its replica-0 rank (collective)."""
        return self.pipe.optimizer_state_dict(opt)

    def clip_grad_norm(self, max_norm: float, norm_type: float) -> torch.Tensor:
        """This rank's stage gradients clipped to the whole model's norm (partial norms combined over the stages)."""
        group = self.pipe.pp_group if self.pipe.stages > 1 else None
        return clip_norm(self.pipe.own_parameters(), max_norm, norm_type, group)

    def gather_model(self) -> None:
        """Every rank's ``module`` gets every stage's current weights (collective; no-op when fresh)."""
        self.pipe.gather_model()

    def whole_model(self) -> AbstractContextManager:
        """Stages gathered on entry (collective); inside, ``module`` runs whole on every rank."""
        self.gather_model()
        return super().whole_model()

    def finish(self) -> None:
        """The stages gathered into one model on every rank (collective)."""
        self.gather_model()

    def calls_per_step(self) -> int:
        """The buckets exchanged after the schedule, or the stage's DDP buckets (none with one replica)."""
        if self.post_backward:
            return len(self.post_backward)
        return bucket_count(self.model) if isinstance(self.model, DDP) else 0

    def report(self, skip: int) -> dict[str, Any]:
        """The ``pipeline`` object of the run summary, once the stages were cut (collective)."""
        return {"pipeline": self.pipe.report(skip)} if self.pipe.schedule is not None else {}

    def release(self) -> Layout:
        """Drop the schedule, the stages' DDP and the groups; the whole module runs bare from now."""
        self.pipe.release()
        self.model = self.module
        return Bare(self.module, self.meter)


def pipeline_layout(model: nn.Module, env: DistEnv, cfg: StrategyConfig, autocast: Callable[[], Any],
                    meter: CommMeter, layers: list[str] | None) -> PipelineLayout:
    """Pipeline (x data) parallelism: the stage groups now, the stages cut at the first step."""
    from ..pipeline import Pipeline  # torch.distributed.pipelining costs ~2 s of import in every rank: only when used

    return PipelineLayout(model, meter, Pipeline(model, env, cfg, autocast, layers), cfg)
