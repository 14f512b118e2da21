"""Distributed evaluation whose global loss and accuracy are exact for any eval-set size, and the run's evaluator."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..config import Config
from ..distributed import DistEnv
from ..log import logger
from ..strategies import Strategy
from .survive.guard import Guard

__all__ = ["Evaluator", "evaluate_batches", "shard_batches"]


class Evaluator:
    """The run's evaluation (``Run.evaluate``): every rank its share of the data, on the whole model.

    Keeps the last result for the run summary.

    Example::

        ev = Evaluator(cfg, env, guard)
        metrics = ev.evaluate(strategy, val_set, step=100, ended=True)  # {"loss", "accuracy", "samples"}
    """

    def __init__(self, cfg: Config, env: DistEnv, guard: Guard):
        self.cfg, self.env, self.guard = cfg, env, guard
        self.result: tuple[float, float, int] = (float("nan"), float("nan"), 0)  # (loss, accuracy, samples)
        self._warned = False  # local SGD's per-replica warning, once per run

    @torch.no_grad()
    def evaluate(self, st: Strategy, data: Any, loss_fn: Callable | None = None, batch_size: int | None = None,
                 batches: Any = None, step: int = 0, ended: bool = False) -> dict[str, float]:
        """Exact distributed evaluation of ``(input, target)`` batches at optimizer step ``step``."""
        if st.averaging is not None and not ended and not self._warned:
            self._warned = True
            logger.warning("run.evaluate under local SGD before run.end_training(): each rank evaluates its own "
                           "replica, not their average; call run.end_training() first for the model you keep")
        self.guard.mark("evaluate", step)
        env = self.env
        if batches is None:
            batches = shard_batches(data, batch_size or self.cfg.data.batch_size, env.rank, env.world_size,
                                    env.device)
        with st.whole_model():  # pipelined or FSDP: every rank evaluates its shard of the data on the whole model
            loss, acc, n = evaluate_batches(st.module, batches, env.device, st.autocast, loss_fn)
        self.result = (loss, acc, n)
        return {"loss": loss, "accuracy": acc, "samples": n}


@torch.no_grad()
def evaluate_batches(module: nn.Module, batches: Iterable[Any], device: torch.device,
                     autocast: Callable[[], AbstractContextManager], loss_fn: Callable | None = None
                     ) -> tuple[float, float, int]:
    """(mean loss, accuracy or nan, samples) of ``(input, target)`` batches over every rank's shard, exactly.

    Shards are uneven (no padding), so each rank sums its own loss, hits and count, and one all-reduce of the
    sums gives the exact global figures; no collective runs per batch, so ranks with fewer batches cannot
    hang the others.

    ``loss_fn(output, target)`` returns the batch mean; it is weighted by the batch size, so the global
    mean is exact. Accuracy is counted when the output holds class scores for integer targets.
    """
    loss_fn = loss_fn or nn.functional.cross_entropy
    was_training = module.training
    module.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss x n, hits, n, n with accuracy
    for x, y in batches:
        with autocast():  # the forward and the loss, as in training: nothing cast back
            out = module(x)
            loss = loss_fn(out, y)
        n = len(y)
        sums[0] += loss.double() * n
        sums[2] += n
        if torch.is_tensor(out) and out.dim() == 2 and y.dim() == 1 and not y.is_floating_point():
            sums[1] += (out.argmax(1) == y).sum()
            sums[3] += n
    dist.all_reduce(sums)
    module.train(was_training)
    loss, hits, n, n_acc = sums.tolist()
    return (loss / n if n else float("nan")), (hits / n_acc if n_acc else float("nan")), int(n)


def shard_batches(data: Any, batch_size: int, rank: int, world: int, device: torch.device) -> Iterator[Any]:
    """This rank's share of ``data`` (a Dataset or DataLoader) in batches on ``device``: every sample once overall."""
    from torch.utils.data import DataLoader, default_collate

    from ..data.loader import move_to
    from ..data.sampler import eval_indices
    collate = default_collate
    if isinstance(data, DataLoader):
        batch_size, collate, data = data.batch_size or batch_size, data.collate_fn, data.dataset
    idx = eval_indices(len(data), rank, world)
    for i in range(0, len(idx), batch_size):
        yield move_to(collate([data[j] for j in idx[i:i + batch_size]]), device)
