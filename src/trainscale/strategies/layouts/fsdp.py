"""FSDP2: the module sharded in place; ``model`` and ``module`` are the same sharded module.

Every rank holds 1/W of the parameters, gradients and optimizer state; a whole-model state, an optimizer
state or a forward outside training gathers the shards (collective).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ...config import StrategyConfig
from ...distributed import DistEnv
from ..comm import CommMeter
from ..fsdp import FsdpState, apply_fsdp
from .bare import Bare

if TYPE_CHECKING:
    from .protocol import Layout

__all__ = ["FSDPLayout", "fsdp_layout"]


class FSDPLayout(Bare):
    """The sharded module and its ``FsdpState`` (units, byte counts, the reduce-scatter switch).

    Example::

        layout = fsdp_layout(model, env, cfg.strategy, CommMeter())
        layout.adopt_optimizer(optimizer)     # built on the unsharded parameters
    """

    name = "fsdp"

    def __init__(self, module: nn.Module, meter: CommMeter, state: FsdpState):
        super().__init__(module, meter)
        self.state = state

    def set_grad_sync(self, sync: bool, comm: bool = True) -> None:
        """Reduce-scatter in the next backward, or not (forward gathers whatever ``comm`` says: config refuses it)."""
        self.state.set_sync(sync)

    def no_sync(self) -> AbstractContextManager:
        """FSDP's ``no_sync``: backward inside accumulates unsharded gradients, without a reduce-scatter."""
        return self.state.no_sync()

    @property
    def syncs_gradients(self) -> bool:
        """Whether the backward now running reduce-scatters gradients."""
        return self.state.sync

    def model_state_dict(self) -> dict[str, Any]:
        """The whole model's state as plain tensors (collective: the shards are gathered)."""
        return self.state.full_state_dict()

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        """Load a whole-model state: each rank keeps its shard."""
        self.state.load_full_state_dict(state)

    def optimizer_state_dict(self, opt: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
        """The whole optimizer state, each sharded tensor gathered (collective)."""
        return self.state.full_optimizer_state(opt)

    def load_optimizer_state_dict(self, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a whole optimizer state: each rank keeps its shard of it."""
        opt.load_state_dict(state)
        self.state.shard_optimizer_state(opt)

    def adopt_optimizer(self, opt: torch.optim.Optimizer | None) -> None:
        """Point the user's optimizer at the sharded parameters (fully_shard replaced the ones it was built on)."""
        self.state.rebind_optimizer(opt)

    def whole_model(self) -> AbstractContextManager:
        """Inside, every unit stays gathered, so forwards make no collective (collective on entry)."""
        return self.state.gathered()

    def report(self, skip: int) -> dict[str, Any]:
        """The ``fsdp`` object of the run summary."""
        return {"fsdp": self.state.report()}

    def release(self) -> Layout:
        """The sharded module keeps its mesh; from now it runs as it is."""
        return Bare(self.module, self.meter)


def fsdp_layout(model: nn.Module, env: DistEnv, cfg: StrategyConfig, meter: CommMeter) -> FSDPLayout:
    """Shard ``model`` with FSDP2; the meter counts its all-gathers and reduce-scatters from the unit sizes."""
    state = apply_fsdp(model, env, cfg)
    # No gradient hooks: FSDP sets the sharded gradients itself, after the reduce-scatter.
    meter.fixed_bytes = state.allgather_bytes + state.reduce_scatter_bytes
    meter.blocked_is_exposed = True
    return FSDPLayout(model, meter, state)
