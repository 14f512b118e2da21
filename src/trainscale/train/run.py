"""The run API: a user's own training loop with every strategy and measurement of ``trainscale train``.

The user keeps their loop, loss, optimizer and batch structure; the run owns the process group, the
strategy (DDP, fusion, overlap, compression, local SGD, ZeRO, AMP, accumulation, pipeline), the sharded input
pipeline and the step's seams, and delegates the work to its components: the feed (``feed/batches.py``: loaders,
shards, the loop's batches), the stepper (``stepper.py``: backward, clipping, the optimizer step), the
evaluator, the checkpointer (save, load, cadence), the instruments (clocks, experiments), the summary builder
and the run's end (``ending.py``). ``Trainer`` is one user of this API.

The lab switches experiments on without editing the script: ``TRAINSCALE_ARGS`` holds configuration
overrides (``--ablate.phases base,no_data,no_comm --job.steps 40``), applied after the script's own,
and ``TRAINSCALE_JSON`` names the summary file.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..config import Config, apply_overrides, parse_override_args
from ..data import DataInfo
from ..data.loader import TrainLoader
from ..distributed import DistEnv, init_distributed
from ..distributed.teardown import on_exit
from ..log import setup_logging
from ..strategies import Strategy, apply_strategy, apply_zero
from . import ending, reduce
from .checkpoint.checkpointer import Checkpointer
from .errors import RunError, report_bad_input_in_one_line
from .evaluate import Evaluator
from .feed.batches import Feed
from .feed.sources import BatchSource
from .instruments import Instruments
from .instruments.flops import FlopMeter
from .instruments.losses import LossWindow
from .prepared import PreparedModel
from .report.logpoints import LogPoints
from .startup import announce, build_instruments, seed_rank
from .state import Meters, Prepared, RunContext, RunState
from .stepper import Stepper
from .survive.guard import Guard

__all__ = ["Run", "init", "RunError", "PreparedModel", "ENV_ARGS", "ENV_JSON"]

ENV_ARGS = "TRAINSCALE_ARGS"  # configuration overrides set by the lab (shell-quoted --section.field value)
ENV_JSON = "TRAINSCALE_JSON"  # where the run summary goes (set by the lab)


def init(cfg: Config | None = None, args: list[str] | None = None, json_path: str | None = None) -> Run:
    """Join the process group (under ``trainscale launch`` / torchrun, or alone) and start a run.

    ``args`` are ``--section.field value`` overrides of ``cfg`` (default: ``Config()``); the lab's
    ``TRAINSCALE_ARGS`` come last and win.

    Example::

        run = trainscale.init(args=["--strategy.bucket_mb", "4"])
        model, optimizer, loader = run.prepare(model, optimizer, dataset_or_loader)
        for x, y in run.batches(loader, steps=1000):
            loss = loss_fn(model(x), y)
            run.backward(loss)
            run.clip_gradients(1.0)   # optional: unscaled, whole-model norm
            run.step()
        run.finish()
    """
    report_bad_input_in_one_line()  # a RunError or ConfigError that ends the script: one line, not a traceback
    lab = shlex.split(os.environ.get(ENV_ARGS, ""))
    values = {**parse_override_args(list(args or [])), **parse_override_args(lab)}
    cfg = apply_overrides(cfg or Config(), values) if values else (cfg or Config())
    forced_steps = cfg.job.steps if "job.steps" in parse_override_args(lab) else None
    return Run(cfg, json_path or os.environ.get(ENV_JSON) or None, forced_steps)


class Run:
    """One training run on this rank (see ``init``): the step's seams, delegating to components that share
    ``state`` (the loop's counters) and ``meters`` (loss window, FLOPs, log points)."""

    def __init__(self, cfg: Config, json_path: str | None = None, forced_steps: int | None = None):
        self.cfg, self.json_path = cfg, json_path
        setup_logging(cfg.log.level)
        self.owns_group = not (dist.is_available() and dist.is_initialized())  # then finish() leaves it
        self.env: DistEnv = init_distributed(cfg.job)
        self.guard = Guard(cfg, self.env)  # watchdog, SIGTERM, injected faults: before the first collective
        torch.manual_seed(cfg.job.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
        # Built by prepare(), in this order; each is kept as soon as it exists, so a failed prepare still ends cleanly.
        self.strategy: Strategy | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.instruments: Instruments | None = None
        self.checkpointer: Checkpointer | None = None
        self.stepper: Stepper | None = None
        self.meters = Meters(LossWindow(self.env.device, cfg.log.every), FlopMeter(self.env.device, cfg.strategy.amp),
                             LogPoints(cfg, self.env.is_main, self.run_dir, self.out_dir))
        self.state = RunState(total_steps=cfg.job.steps, forced_steps=forced_steps)
        self.ctx = RunContext(cfg, self.env, self.guard, self.state, self.meters, self.out_dir)
        self.feed = Feed(self.ctx)
        self.evaluator = Evaluator(cfg, self.env, self.guard)
        self.summary: dict[str, Any] | None = None  # finish()'s
        on_exit(self._at_exit)  # a script that never calls finish() still ends the group cleanly

    # ------------------------------------------------------------------ set-up and what the loop reads
    @property
    def device(self) -> torch.device:
        return self.env.device

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    @property
    def accum(self) -> int:
        """Micro-batches per optimizer step (``strategy.grad_accum``)."""
        return self.cfg.strategy.grad_accum

    @property
    def restarts(self) -> int:
        """How many times the launcher restarted this job before this attempt (0 on the first)."""
        return self.guard.attempt

    @property
    def step_count(self) -> int:
        """Optimizer steps done (from the checkpoint's step after ``load``)."""
        return self.state.step_count

    @step_count.setter
    def step_count(self, value: int) -> None:
        self.state.step_count = value

    @property
    def total_steps(self) -> int:
        """The optimizer step the loop of ``batches`` ends at."""
        return self.state.total_steps

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over every replica (0 before a loader is made)."""
        return self.feed.global_batch

    @property
    def preempted(self) -> bool:
        """Whether ``batches`` stopped early on SIGTERM: save, then exit with EXIT_PREEMPTED."""
        return self.state.preempted

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, data: Any = None,
                data_info: DataInfo | None = None, layers: list[str] | None = None
                ) -> tuple[nn.Module, torch.optim.Optimizer | None, Any]:
        """Move ``model`` to the device and wrap it with the configured strategy; shard and prefetch ``data``.

        ``optimizer`` must be built on ``model``'s parameters (they stay the same objects); under
        ``strategy.shard_optimizer`` it comes back as a ZeroRedundancyOptimizer. ``data`` is a Dataset or
        a DataLoader (its batch size, workers and collate_fn are kept; its sampler is replaced by one
        that shards the data across ranks), or a source of this rank's batches as the user shards or seeds them:
        a function returning a batch (nanoGPT's ``get_batch``), an ``IterableDataset`` or a DataLoader over
        one, an iterator. ``data_info``: built-in image data, normalised on the device.
        ``layers``: for a pipeline, the names of the submodules whose sequential composition is the model's
        forward (not needed for an ``nn.Sequential`` or the registry's models).
        """
        if self.strategy is not None:
            raise RunError("run.prepare() was already called: one model per run")
        st = self.strategy = apply_strategy(model, self.env, self.cfg.strategy, layers)
        st.adopt_optimizer(optimizer)  # FSDP replaced the parameters the optimizer was built on
        if optimizer is not None and self.cfg.strategy.shard_optimizer:
            optimizer = apply_zero(optimizer)
        self.optimizer = optimizer
        ins = self.instruments = build_instruments(self.ctx, st)
        self.checkpointer = Checkpointer(self.ctx, st, optimizer, self.feed.loaders)
        self.meters.flops.measure_peak()  # CPU: a matmul benchmark under 0.5 s, cached
        loader = self.loader(data, data_info) if data is not None else None
        if self.is_main:
            self.meters.points.open()  # the tracker's import and set-up, before the first timed step
        announce(self.env, self.guard, st)
        seed_rank(self.cfg.job.seed, self.env.rank)
        self.stepper = Stepper(self.ctx, Prepared(st, optimizer, ins), self.feed)
        st.memory.reset()  # the peak memory of training: model, shards and optimizer exist from here
        return self.stepper.model, optimizer, loader

    def loader(self, data: Any, info: DataInfo | None = None) -> TrainLoader | BatchSource:
        """The run's loader over ``data`` (see ``prepare``): this rank's shard or this rank's batches, on the device."""
        return self.feed.loader(data, info, self.strategy)

    # ------------------------------------------------------------------ the loop
    def batches(self, loader: Any, steps: int | None = None) -> Iterator[Any]:
        """Device batches for ``steps`` optimizer steps (x ``strategy.grad_accum`` micro-batches each).

        ``steps`` None: one epoch of this rank's shard (``job.steps`` when the lab sets it); a batch function
        or an iterable without a length needs ``steps``. The time spent waiting here is the step's data wait.

        Example::

            for x, y in run.batches(get_batch, steps=5000):   # a function: each call returns this rank's batch
                run.backward(loss_fn(model(x), y))
                run.step()
        """
        stepper = self._need_prepared("batches")  # a generator: checked at the first batch, as before
        for batch in self.feed.batches(loader, steps, stepper.parts):
            yield batch
            stepper.model._end_autocast()  # the loop's body ended: so did its forward and loss

    def forward_backward(self, x: Any, y: Any, loss_fn: Any) -> torch.Tensor | None:
        """``run.backward(loss_fn(model(x), y))``, or, pipelined, every micro-batch through the schedule.

        Returns the loss (pipelined: on the last stage; None on the others). The one call that works for
        DDP and pipelines alike::

            for x, y in run.batches(loader):
                run.forward_backward(x, y, loss_fn)
                run.step()
        """
        return self._need_prepared("forward_backward").forward_backward(x, y, loss_fn)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` with the loss scaler (fp16), accumulation and the instruments."""
        self._need_prepared("backward").backward(loss)

    def clip_gradients(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor | None:
        """Clip the whole model's gradient norm to ``max_norm``, as ``torch.nn.utils.clip_grad_norm_`` would.

        Call it between the last ``backward`` of an optimizer step and ``run.step()``. It exchanges the
        gradients first when the exchange waits for the step (``strategy.overlap false``), unscales them under
        fp16 (the scaler's ``unscale_``, so ``max_norm`` is in the model's units), and works under DDP, ZeRO,
        local SGD and pipelines. Returns the norm before clipping; on a micro-batch that does not end an
        accumulation, does nothing and returns None (the gradients are not complete yet).

        Example::

            run.backward(loss)
            run.clip_gradients(1.0)
            run.step()
        """
        return self._need_prepared("clip_gradients").clip_gradients(max_norm, norm_type)

    def no_sync(self) -> Any:
        """Context for the micro-steps of a user's own accumulation: backward inside it skips the gradient exchange.

        nanoGPT's ``model.require_backward_grad_sync = last`` as a context: wrap every micro-step but the last
        of an optimizer step; the last one's backward exchanges the summed gradients. Gradients then equal
        ``strategy.grad_accum``'s (divide each micro-step's loss by their number, as it does). Under overlap off,
        compression, local SGD and ZeRO it is the same, under FSDP it is FSDP's own (no reduce-scatter until the
        last micro-step); under a pipeline it is refused (the schedule runs the micro-batches). Leave
        ``strategy.grad_accum`` at 1: the two accumulations would multiply.

        Example::

            for x, y in run.batches(loader, steps=1000):          # a batch of K micro-batches
                for i, (xm, ym) in enumerate(zip(x.chunk(K), y.chunk(K))):
                    with run.no_sync() if i < K - 1 else contextlib.nullcontext():
                        run.backward(loss_fn(model(xm), ym) / K)
                run.clip_gradients(1.0)
                run.step()
        """
        # Not a seam of the loss: ``out = model(x)`` then ``with run.no_sync(): run.backward(loss_fn(out, y))``
        # computes its loss inside the forward's autocast region still.
        return self._need_prepared("no_sync", end_autocast=False).no_sync()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce ``tensor`` in place over every rank (collective) and return it: sum, mean, max, min, product.

        For a user's own evaluation loop; call it on every rank, outside the timed step (``run.untimed()``).

        Example::

            hits = run.all_reduce(torch.tensor([correct, seen], device=run.device))
        """
        return reduce.all_reduce(tensor, op)

    def mean(self, value: torch.Tensor | float) -> torch.Tensor:
        """The mean of ``value`` over every rank (collective), as a new tensor on the run's device.

        Example::

            val_loss = run.mean(torch.stack(batch_losses).mean()).item()
        """
        return reduce.mean(value, self.device)

    def step(self) -> bool:
        """The optimizer step (on the last micro-batch of an accumulation); returns whether one was taken."""
        return self._need_prepared("step").step()

    def untimed(self) -> Any:
        """Context for work between steps that is not step time (evaluation, checkpoints)."""
        return self._need_prepared("untimed").instruments.untimed()

    # ------------------------------------------------------------------ evaluation and checkpoints
    def evaluate(self, data: Any, loss_fn: Any = None, batch_size: int | None = None,
                 batches: Any = None) -> dict[str, float]:
        """Exact distributed evaluation of ``(input, target)`` batches: each sample counted once, any set size.

        Returns ``loss`` (mean of ``loss_fn`` over samples; cross-entropy by default), ``samples`` and, for
        class scores against integer labels, ``accuracy``. ``batches``: this rank's device batches, already
        split (``data`` is then ignored). The last result goes into the run summary.
        """
        st = self._need_prepared("evaluate").strategy
        return self.evaluator.evaluate(st, data, loss_fn, batch_size, batches, self.state.step_count, self.state.ended)

    def save(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        """Checkpoint: model, optimizer, loss scaler, strategy counters, step, loader position, every rank's RNG.

        Collective (call on every rank). ``PATH.pt``: one file, rank 0 writes atomically; any other name:
        a sharded folder (``torch.distributed.checkpoint``), each rank writes its part (asynchronously
        with ``checkpoint.async_save``). When complete, the folder's ``latest`` pointer names it. A folder
        that is unwritable or full raises CheckpointWriteError on every rank; the previous checkpoint stays.
        """
        ck = self._need_checkpointer("save")
        with self.untimed():  # writing is not step time, whoever calls it
            ck.save(path, self.state.step_count, extra)

    def checkpoint(self, final: bool = False, force: bool = False) -> None:
        """The periodic checkpoint into ``checkpoint.dir`` when ``checkpoint.every`` asks for one (collective).

        ``final``: the ``last`` checkpoint; ``force``: now, whatever the cadence (a preemption). A write that
        fails stops the run or, with ``checkpoint.on_error warn``, is reported and skipped; ``checkpoint.keep``
        prunes older ones. Without ``checkpoint.dir`` it does nothing.
        """
        ck, step = self._need_checkpointer("checkpoint"), self.state.step_count
        if self.cfg.checkpoint.dir and (final or force or ck.should_save(step)):
            with self.untimed():
                ck.save_periodic(step, final)

    def wait_for_checkpoint(self) -> None:
        """Block until an asynchronous checkpoint is complete, then publish it."""
        if self.checkpointer is not None:
            self.checkpointer.wait()

    def load(self, path: str | Path) -> dict[str, Any]:
        """Resume from ``save``'s checkpoint: the next step continues where that run stopped. Returns the state.

        ``path``: a ``.pt`` file, a sharded folder (loaded at this world size: DCP reshards), or a checkpoint
        folder, whose newest complete checkpoint is used (the one ``latest`` names; an unreadable one is
        skipped with a warning). A folder with none: nothing is loaded and ``{}`` comes back.
        """
        state = self._need_checkpointer("load").load(path)
        if state:
            self.state.step_count = self.state.start_step = int(state["step"])
            self.meters.points.resumed()
        return state

    # ------------------------------------------------------------------ the end
    def end_training(self) -> None:
        """After the last step (collective): loaders stopped, real modules back, local SGD's replicas averaged."""
        if not self.state.ended:
            self.state.ended = True
            if self.stepper is not None:
                self.stepper.end_loop()  # the autocast region closed, the loss windows still on their way logged
            ending.end_training(self.ctx, self.feed, self.strategy, self.instruments)

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """End the run: the summary (written to ``json_path`` / ``TRAINSCALE_JSON``, printed), then teardown."""
        if self.state.finished:
            return self.summary or {}
        self.end_training()
        self.wait_for_checkpoint()
        self.summary = {}
        if self.strategy is not None:  # a run never prepared has nothing to summarise, only groups to end
            self.summary = ending.summarize(self.ctx, self._need_prepared("finish").parts, self.feed,
                                            self.evaluator.result, extra or {})
        if self.is_main and self.summary:
            ending.publish(self.summary, self.json_path, self.cfg)
        self._end_groups(barrier=True)
        return self.summary

    def _at_exit(self) -> None:
        """The exit guard's call for a run that never called ``finish()`` (no collective: a rank may be gone)."""
        if not self.state.finished:
            ending.close_at_exit(self.feed, self.meters, self.instruments, self.checkpointer)
            self._end_groups(barrier=False)

    def _end_groups(self, barrier: bool) -> None:
        holders = [self.strategy, self.checkpointer, self.optimizer if self.owns_group else None]
        ending.end_groups(self.state, self.owns_group, self.guard, holders, barrier)

    def _need_prepared(self, what: str, end_autocast: bool = True) -> Stepper:
        if self.stepper is None:
            raise RunError(f"run.{what}() needs run.prepare(model, optimizer, data) first")
        if end_autocast:
            self.stepper.model._end_autocast()  # a call into the run ends the forward's autocast region
        return self.stepper

    def _need_checkpointer(self, what: str) -> Checkpointer:
        self._need_prepared(what)
        assert self.checkpointer is not None
        return self.checkpointer

    @property
    def out_dir(self) -> Path:
        """Artefacts (profile tables, sleep times): job.out, else beside the summary JSON, else here."""
        return self.run_dir or Path(".")

    @property
    def run_dir(self) -> Path | None:
        """The run's folder: job.out, else the summary JSON's folder; None when neither is given."""
        if self.cfg.job.out:
            return Path(self.cfg.job.out)
        return Path(self.json_path).parent if self.json_path else None
