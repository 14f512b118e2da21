"""The bare module: the user's model as it is, where there is no one to exchange gradients with (world size 1).

No wrapper, no bucket copies, no all-reduce: the step is the plain loop's step. The gradient-sync switch and
``no_sync`` keep their meaning (whether this backward would close an accumulation) and exchange nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..comm import CommMeter
from ..local_sgd import ModelAveraging
from ..zero import optimizer_state_dict
from .ops import clip_norm

if TYPE_CHECKING:
    from .protocol import Layout

__all__ = ["Bare"]


class Bare:
    """A layout where every operation is the plain loop's; the other layouts override what they exchange.

    Example::

        layout = Bare(model, CommMeter())
        with layout.no_sync():          # nothing to skip: backward accumulates, as it would anyway
            loss.backward()
    """

    name = "bare"
    pipelined = False

    def __init__(self, module: nn.Module, meter: CommMeter):
        self.model: Any = module
        self.module, self.meter = module, meter
        self.averaging: ModelAveraging | None = None
        self._sync = True

    # ---- gradient sync: a flag, nothing to exchange
    def set_grad_sync(self, sync: bool, comm: bool = True) -> None:
        """Whether the next backward closes an accumulation (nothing is exchanged either way)."""
        self._sync = sync

    @contextlib.contextmanager
    def _no_sync(self) -> Iterator[None]:
        before = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = before

    def no_sync(self) -> AbstractContextManager:
        """Backward inside accumulates: what it does with or without the context here."""
        return self._no_sync()

    @property
    def syncs_gradients(self) -> bool:
        """Whether the backward now running closes an accumulation (the meter notes its wait then)."""
        return self._sync

    def sync_gradients(self) -> int:
        """The exchange after backward (overlap off): none here; returns its all-reduce calls, 0."""
        return 0

    # ---- the step
    def pipeline_step(self, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable[..., torch.Tensor],
                      optimizer: torch.optim.Optimizer | None) -> torch.Tensor | None:
        """Only a pipelined layout has a schedule to run."""
        raise RuntimeError(f"pipeline_step() on the {self.name} layout: the model is not cut into stages")

    def compute_s(self) -> float:
        """Compute seconds the layout timed itself in the last step (a pipeline's stages); 0.0: the step clock's."""
        return 0.0

    def data_shard(self, rank: int, world: int) -> tuple[int, int]:
        """(which shard, of how many) of the training data this rank reads: its own."""
        return rank, world

    def label_rows(self, rows: list[dict[str, Any]]) -> None:
        """Add layout columns to the environment table's rows: none here."""

    def share_loss(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank computed its own loss: ``t`` as it is."""
        return t

    # ---- state
    def model_state_dict(self) -> dict[str, Any]:
        """The whole model's state: the module's own."""
        return self.module.state_dict()

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        """Load a whole-model state into the module."""
        self.module.load_state_dict(state)

    def optimizer_state_dict(self, opt: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
        """The whole optimizer state (ZeRO gathers it to rank 0; collective there)."""
        return optimizer_state_dict(opt, rank)

    def load_optimizer_state_dict(self, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a whole optimizer state."""
        opt.load_state_dict(state)

    def adopt_optimizer(self, opt: torch.optim.Optimizer | None) -> None:
        """The user's optimizer already holds the module's parameters: nothing to rebind."""

    def clip_grad_norm(self, max_norm: float, norm_type: float) -> torch.Tensor:
        """Clip the module's gradients to a total norm of ``max_norm``; the norm before clipping."""
        return clip_norm(list(self.module.parameters()), max_norm, norm_type)

    # ---- the whole model
    def gather_model(self) -> None:
        """Every rank holds the whole model already."""

    def whole_model(self) -> AbstractContextManager:
        """Inside, the module's forward needs no collective: always so here."""
        return contextlib.nullcontext()

    # ---- around the optimizer step
    def after_optimizer_step(self) -> None:
        """After ``optimizer.step()``: nothing to average."""

    def end_step(self) -> None:
        """Close the optimizer step: nothing to tune."""

    def finish(self) -> None:
        """After the last step: the module is the one final model already."""

    def load_steps(self, steps: int) -> None:
        """Resume step-counting parts (local SGD's hook and averager) at ``steps``: none here."""

    def calls_per_step(self) -> int:
        """All-reduce calls per optimizer step: none."""
        return 0

    def report(self, skip: int) -> dict[str, Any]:
        """The layout's own fields of the run summary beyond ``layout`` (collective where a layout gathers)."""
        return {}

    def release(self) -> Layout:
        """End of the run: drop what holds a process group; returns the layout the module runs under from now."""
        return self
