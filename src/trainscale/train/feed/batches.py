"""The run's input side: its loaders over this rank's shard of the data, and the batches of its loop."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ...config import Config
from ...data import DataInfo
from ...data.loader import TrainLoader
from ...distributed import DistEnv
from ...log import logger
from ...strategies import Strategy
from ..errors import RunError
from ..instruments import Instruments
from ..state import Meters, RunState
from ..survive.guard import Guard
from .loading import is_ready_loader, make_loader
from .sources import BatchSource, is_batch_source

__all__ = ["Feed"]


class Feed:
    """The run's loaders and its loop's batches: this rank's shard, the data wait, the preemption boundary.

    Example::

        feed = Feed(cfg, env, guard, state, meters)
        loader = feed.loader(dataset)
        for batch in feed.batches(loader, 100, strategy, instruments):
            ...  # backward and step, which move state.micro and state.step_count
    """

    def __init__(self, cfg: Config, env: DistEnv, guard: Guard, state: RunState, meters: Meters):
        self.cfg, self.env, self.guard, self.state, self.meters = cfg, env, guard, state, meters
        self.loaders: list[Any] = []  # every loader made: checkpoints save their positions, the end closes them
        self.global_batch = 0  # samples per optimizer step over every replica
        self.strategy: Strategy | None = None  # set by prepare(): a pipeline's stages share one shard

    @property
    def accum(self) -> int:
        """Micro-batches per optimizer step (``strategy.grad_accum``)."""
        return self.cfg.strategy.grad_accum

    def shard(self) -> tuple[int, int]:
        """(which shard, of how many) of the training data this rank reads."""
        if self.strategy is None:
            return self.env.rank, self.env.world_size
        return self.strategy.data_shard(self.env.rank, self.env.world_size)

    def loader(self, data: Any, info: DataInfo | None = None) -> TrainLoader | BatchSource:
        """The run's loader over ``data``: a Dataset or DataLoader sharded over the ranks and prefetched to the
        device, or a user's batch function or iterable (``BatchSource``: this rank's batches as they come)."""
        shard = self.shard()
        if is_ready_loader(data):
            loader = data
        elif is_batch_source(data):  # the user's function or iterable gives this rank's batches: no sharding
            loader = BatchSource(data, self.env.device)
        else:
            loader = make_loader(self.cfg, data, info, self.env.device, shard, self.env.is_main)
        if loader not in self.loaders:
            self.loaders.append(loader)
            bs = getattr(loader, "batch_size", None) or self.cfg.data.batch_size
            self.global_batch = bs * shard[1] * self.accum
        return loader

    def batches(self, loader: Any, steps: int | None, st: Strategy, ins: Instruments) -> Iterator[Any]:
        """Device batches for ``steps`` optimizer steps (x ``strategy.grad_accum`` micro-batches each): ``Run.batches``."""
        loader, state, meters, guard, accum = self.loader(loader), self.state, self.meters, self.guard, self.accum
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
