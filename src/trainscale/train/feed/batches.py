"""The run's input side: its loaders over this rank's shard of the data, and the batches of its loop."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ...data import DataInfo
from ...data.loader import TrainLoader
from ...distributed import DistEnv
from ...log import logger
from ...strategies import Strategy
from ..errors import RunError
from ..state import Prepared, RunContext
from .loading import is_ready_loader, make_loader
from .sources import BatchSource, is_batch_source

__all__ = ["Feed", "data_shard"]


def data_shard(strategy: Strategy | None, env: DistEnv) -> tuple[int, int]:
    """(which shard, of how many) of the training data this rank reads: a pipeline's stages share one.

    Example::

        data_shard(None, env)   # (env.rank, env.world_size) before a strategy exists
    """
    if strategy is None:
        return env.rank, env.world_size
    return strategy.data_shard(env.rank, env.world_size)


class Feed:
    """The run's loaders and its loop's batches: this rank's shard, the data wait, the preemption boundary.

    Example::

        feed = Feed(ctx)
        loader = feed.loader(dataset, strategy=parts.strategy)
        for batch in feed.batches(loader, 100, parts):
            ...  # backward and step, which move state.micro and state.step_count
    """

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self.loaders: list[Any] = []  # every loader made: checkpoints save their positions, the end closes them
        self.global_batch = 0  # samples per optimizer step over every replica

    @property
    def accum(self) -> int:
        """Micro-batches per optimizer step (``strategy.grad_accum``)."""
        return self.ctx.cfg.strategy.grad_accum

    def loader(self, data: Any, info: DataInfo | None = None, strategy: Strategy | None = None
               ) -> TrainLoader | BatchSource:
        """The run's loader over ``data``: a Dataset or DataLoader sharded over the ranks (as ``strategy`` reads
        them) and prefetched to the device, or a user's batch function or iterable (``BatchSource``: this rank's
        batches as they come)."""
        cfg, env = self.ctx.cfg, self.ctx.env
        shard = data_shard(strategy, env)
        if is_ready_loader(data):
            loader = data
        elif is_batch_source(data):  # the user's function or iterable gives this rank's batches: no sharding
            loader = BatchSource(data, env.device)
        else:
            loader = make_loader(cfg, data, info, env.device, shard, env.is_main)
        if loader not in self.loaders:
            self.loaders.append(loader)
            bs = getattr(loader, "batch_size", None) or cfg.data.batch_size
            self.global_batch = bs * shard[1] * self.accum
        return loader

    def batches(self, loader: Any, steps: int | None, parts: Prepared) -> Iterator[Any]:
        """Device batches for ``steps`` optimizer steps (x ``strategy.grad_accum`` micro-batches each): ``Run.batches``."""
        st, ins = parts.strategy, parts.instruments
        loader, accum = self.loader(loader, strategy=st), self.accum
        state, meters, guard = self.ctx.state, self.ctx.meters, self.ctx.guard
        state.total_steps = state.forced_steps or steps or max(1, loader.batches_per_epoch // accum)
        if meters.points.start(state.total_steps, state.step_count):
            meters.losses.start()
            ins.loop_starts(meters.losses.t_loop)
        while state.step_count < state.total_steps:
            if guard.at_boundary(state.step_count):  # one bool test unless a SIGTERM came
                state.preempted = True
                logger.warning(f"preempted (SIGTERM): stopping after step {state.step_count}")
                break
            mode = state.mode = ins.mode(state.step_count - state.start_step)
            guard.mark("data", state.step_count)
            t0 = time.perf_counter()
            if mode.no_data:
                state.fixed = state.fixed if state.fixed is not None else next(loader)
                batch = state.fixed
            else:
                batch = next(loader)
            ins.data_wait(time.perf_counter() - t0)
            guard.mark("compute", state.step_count)
            # DDP exchanges gradients in backward only on the last micro-step (set before forward).
            st.set_grad_sync(state.last_micro(accum) and not mode.no_comm and not ins.calibrating,
                             comm=not mode.no_comm)
            ins.forward_starts()
            # FLOPs are counted in the last warm-up step (the sleep test's last calibration step, whose compute is
            # still real): never timed, and a torch.compile'd model has compiled by then (counting while dynamo
            # compiles would also count the compiler's own runs).
            meters.flops.at_batch(state.step_count - state.start_step, state.micro, (ins.calib_steps or ins.warm) - 1)
            before = state.step_count * accum + state.micro
            yield batch
            if state.step_count * accum + state.micro == before:
                raise RunError("call run.step() once for every batch that run.batches() yields")

    def close(self) -> None:
        """Every loader's prefetch thread and worker processes end."""
        for loader in self.loaders:
            loader.close()
