"""Local SGD (Lin et al. 2020; PaddlePaddle's localsgd): each rank steps alone after a synchronous warm-up, parameters averaged every H steps.

Built on PyTorch's post-local SGD: ``post_localSGD_hook`` (registered by ``CommHooks``) all-reduces
gradients during the warm-up and stops after it (or keeps all-reducing inside each node when
``strategy.hierarchical`` is set: the cheap intra-node level of PyTorch's two-level scheme), and a
``PeriodicModelAverager`` averages parameters over all ranks after the optimizer step.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.algorithms.model_averaging.utils import average_parameters

from ..config import StrategyConfig
from .comm import CommMeter

__all__ = ["ModelAveraging", "apply_local_sgd", "replica_max_diff"]


def replica_max_diff(module: nn.Module) -> float:
    """Largest difference of any parameter between ranks (collective; 0.0 when replicas are equal)."""
    worst = torch.zeros((), dtype=torch.float64)
    for q in module.parameters():
        hi, lo = q.detach().clone(), q.detach().clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        worst = torch.maximum(worst, (hi - lo).abs().max().double().cpu())
    return worst.item()


class ModelAveraging:
    """Call after ``optimizer.step()`` and before ``zero_grad`` (the averager skips parameters without grads)."""

    __slots__ = ("averager", "module", "meter", "world", "divergence")

    def __init__(self, averager: PeriodicModelAverager, module: nn.Module, meter: CommMeter, world: int):
        self.averager, self.module, self.meter, self.world = averager, module, meter, world
        self.divergence: float | None = None  # largest parameter difference between replicas at the end

    def __call__(self) -> None:
        a = self.averager
        if a.step >= a.warmup_steps and (a.step - a.warmup_steps) % a.period == 0:
            nbytes = sum(p.numel() * p.element_size() for p in self.module.parameters() if p.grad is not None)
            self.meter.collective("all_reduce", nbytes, self.world)
        a.average_parameters(self.module.parameters())

    def state_dict(self) -> dict[str, int]:
        """The averager's step counter: a resumed run averages on the same steps as an uninterrupted one."""
        return {"step": self.averager.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Go on counting from the saved step."""
        self.averager.step = int(state["step"])

    def finish(self) -> None:
        """End of training: note how far the replicas drifted, then average them into the one final model."""
        self.divergence = replica_max_diff(self.module)
        if self.divergence:
            world = dist.group.WORLD
            assert world is not None  # the process group is up until the run closes
            average_parameters(iter(list(self.module.parameters())), world)


def apply_local_sgd(module: nn.Module, world: int, cfg: StrategyConfig, meter: CommMeter) -> ModelAveraging | None:
    """The post-step model averaging of local SGD, or None when ``strategy.local_sgd_period`` is 0."""
    if not cfg.local_sgd_period:
        return None
    with warnings.catch_warnings():  # period 1 is allowed on purpose: it must equal DDP (a parity check)
        warnings.simplefilter("ignore", UserWarning)
        averager = PeriodicModelAverager(period=cfg.local_sgd_period, warmup_steps=cfg.local_sgd_warmup)
    return ModelAveraging(averager, module, meter, world)

