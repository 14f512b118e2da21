"""The run API: a user's own training loop with every strategy and measurement of ``trainscale train``.

The user keeps their loop, loss, optimizer and batch structure; the run owns the process group, the
strategy (DDP, fusion, overlap, compression, local SGD, ZeRO, AMP, accumulation, pipeline), the sharded input
pipeline and the step's seams, and delegates the rest to its components: the checkpointer (save, load,
cadence), the instruments (clocks, experiments, the loss window), the summary builder. ``Trainer`` is one
user of this API.

The lab switches experiments on without editing the script: ``TRAINSCALE_ARGS`` holds configuration
overrides (``--ablate.phases base,no_data,no_comm --job.steps 40``), applied after the script's own,
and ``TRAINSCALE_JSON`` names the summary file.
"""

from __future__ import annotations

import os
import random
import shlex
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..config import Config, apply_overrides, parse_override_args
from ..data import DataInfo
from ..data.loader import TrainLoader
from ..distributed import DistEnv, gather_env_rows, init_distributed
from ..distributed.table import print_env_table
from ..distributed.teardown import end_process_group, on_exit
from ..log import logger, setup_logging
from ..strategies import Strategy, apply_strategy, apply_zero
from .checkpointer import Checkpointer
from .errors import RunError
from .flops import FlopMeter
from .guard import Guard
from .instruments import Instruments, StepMode, start_accounting
from .instruments.losses import LossWindow
from .loading import is_ready_loader, make_loader
from .logpoints import LogPoints
from .prepared import PreparedModel
from .summary import print_summary, write_summary
from .summary_builder import RunRecord, build_summary

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
    lab = shlex.split(os.environ.get(ENV_ARGS, ""))
    values = {**parse_override_args(list(args or [])), **parse_override_args(lab)}
    cfg = apply_overrides(cfg or Config(), values) if values else (cfg or Config())
    forced_steps = cfg.job.steps if "job.steps" in parse_override_args(lab) else None
    return Run(cfg, json_path or os.environ.get(ENV_JSON) or None, forced_steps)


class Run:
    """One training run on this rank: see ``init``."""

    def __init__(self, cfg: Config, json_path: str | None = None, forced_steps: int | None = None):
        self.cfg, self.json_path, self.forced_steps = cfg, json_path, forced_steps
        setup_logging(cfg.log.level)
        self.owns_group = not (dist.is_available() and dist.is_initialized())  # then finish() leaves it
        self.env: DistEnv = init_distributed(cfg.job)
        self.guard = Guard(cfg, self.env)  # watchdog, SIGTERM, injected faults: before the first collective
        torch.manual_seed(cfg.job.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
        self.strategy: Strategy | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.instruments: Instruments | None = None
        self.checkpointer: Checkpointer | None = None
        self.loaders: list[Any] = []
        self.losses = LossWindow(self.env.device, cfg.log.every)
        self.step_count = self.start_step = 0  # optimizer steps done (start_step: where this run resumed)
        self.total_steps, self.global_batch = cfg.job.steps, 0
        self.preempted = False  # batches() stopped early on SIGTERM: save, then exit with EXIT_PREEMPTED
        self.eval_result: tuple[float, float, int] = (float("nan"), float("nan"), 0)
        self.summary: dict[str, Any] | None = None
        self.model: PreparedModel | None = None
        self.flops = FlopMeter(self.env.device, cfg.strategy.amp)  # model FLOPs and peak, for MFU
        self.started_at = datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")
        self.points = LogPoints(cfg, self.env.is_main, self.run_dir, self.out_dir)
        self._loop: dict[str, Any] = {"micro": 0, "mode": StepMode(), "fixed": None, "synced": False,
                                      "ended": False, "finished": False}
        on_exit(self._at_exit)  # a script that never calls finish() still ends the group cleanly

    # ------------------------------------------------------------------ set-up
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

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, data: Any = None,
                data_info: DataInfo | None = None, layers: list[str] | None = None
                ) -> tuple[nn.Module, torch.optim.Optimizer | None, Any]:
        """Move ``model`` to the device and wrap it with the configured strategy; shard and prefetch ``data``.

        ``optimizer`` must be built on ``model``'s parameters (they stay the same objects); under
        ``strategy.shard_optimizer`` it comes back as a ZeroRedundancyOptimizer. ``data`` is a Dataset or
        a DataLoader (its batch size, workers and collate_fn are kept; its sampler is replaced by one
        that shards the data across ranks). ``data_info``: built-in image data, normalised on the device.
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
        # The accounting's clock offsets are measured through the store: every rank is here (prepare is collective).
        acct = start_accounting(self.env.rank, self.env.world_size, self.guard.store, st.meter, self.device.type,
                                self.guard.attempt) if self.cfg.log.accounting else None
        self.instruments = Instruments(self.cfg, self.env.rank, self.is_main, self.device, st.module, self.out_dir,
                                       acct)
        if self.cfg.log.stragglers and self.env.world_size > 1 and not st.pipelined:  # stages differ by design
            self.instruments.watch_stragglers(self.guard.side_store(), self.env.world_size, self.guard.attempt)
        self.checkpointer = Checkpointer(self.cfg, self.env, self.guard, st, optimizer, self.loaders)
        self.flops.measure_peak()  # CPU: a matmul benchmark under 0.5 s, cached
        loader = self.loader(data, data_info) if data is not None else None
        if self.is_main:
            self.points.open()  # the tracker's import and set-up, before the first timed step
        rows = gather_env_rows(self.env)
        st.label_rows(rows)
        self.guard.start()  # every rank has published its first beat before that collective
        if self.is_main and (st.pipelined or not os.environ.get("TRAINSCALE_TABLE_PRINTED")):
            print_env_table(rows, world=str(self.env.world_size), nodes=str(self.env.nnodes), master=self.env.master,
                            backend=self.env.backend, source=self.env.cluster)
        # Each rank its own stream of randomness from here (dropout, augmentation), reproducible from the seed.
        seed = self.cfg.job.seed * 1000 + self.env.rank
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        self.model = PreparedModel(st)
        st.memory.reset()  # the peak memory of training: model, shards and optimizer exist from here
        return self.model, optimizer, loader

    def loader(self, data: Any, info: DataInfo | None = None) -> TrainLoader:
        """trainscale's loader over ``data`` (Dataset or DataLoader): this rank's shard, prefetched to the device."""
        shard = self._shard()
        loader = data if is_ready_loader(data) else make_loader(self.cfg, data, info, self.device, shard, self.is_main)
        if loader not in self.loaders:
            self.loaders.append(loader)
            bs = getattr(loader, "batch_size", None) or self.cfg.data.batch_size
            self.global_batch = bs * shard[1] * self.accum
        return loader

    def _shard(self) -> tuple[int, int]:
        """(which shard, of how many) of the training data this rank reads."""
        if self.strategy is None:
            return self.env.rank, self.env.world_size
        return self.strategy.data_shard(self.env.rank, self.env.world_size)

    # ------------------------------------------------------------------ the loop
    def batches(self, loader: Any, steps: int | None = None) -> Iterator[Any]:
        """Device batches for ``steps`` optimizer steps (x ``strategy.grad_accum`` micro-batches each).

        ``steps`` None: one epoch of this rank's shard (``job.steps`` when the lab sets it). The time
        spent waiting here is the step's data wait.
        """
        st, ins = self._need_prepared("batches")
        loader, loop = self.loader(loader), self._loop
        self.total_steps = self.forced_steps or steps or max(1, loader.batches_per_epoch // self.accum)
        if self.points.start(self.total_steps, self.step_count):
            self.losses.start()
            ins.loop_starts(self.losses.t_loop)
        guard = self.guard
        while self.step_count < self.total_steps:
            if guard.at_boundary(self.step_count):  # one bool test unless a SIGTERM came
                self.preempted = True
                logger.warning(f"preempted (SIGTERM): stopping after step {self.step_count}")
                break
            mode = loop["mode"] = ins.mode(self.step_count - self.start_step)
            guard.mark("data", self.step_count)
            t0 = time.perf_counter()
            if mode.no_data:
                loop["fixed"] = loop["fixed"] if loop["fixed"] is not None else next(loader)
                batch = loop["fixed"]
            else:
                batch = next(loader)
            ins.data_wait(time.perf_counter() - t0)
            guard.mark("compute", self.step_count)
            # DDP exchanges gradients in backward only on the last micro-step (set before forward).
            st.set_grad_sync(self._last_micro() and not mode.no_comm and not ins.calibrating, comm=not mode.no_comm)
            ins.forward_starts()
            # The last warm-up step (the last calibration step of the sleep test, whose compute is still real):
            # the counter's overhead is never timed, and a torch.compile'd model has compiled by then
            # (counting while dynamo compiles also counts the compiler's own runs).
            # Counted in the last warm-up step (the sleep test's last calibration step, whose compute is still
            # real): never timed, and a torch.compile'd model has compiled by then.
            self.flops.at_batch(self.step_count - self.start_step, loop["micro"], (ins.calib_steps or ins.warm) - 1)
            before = self.step_count * self.accum + loop["micro"]
            yield batch
            if self.step_count * self.accum + loop["micro"] == before:
                raise RunError("call run.step() once for every batch that run.batches() yields")

    def _last_micro(self) -> bool:
        return self._loop["micro"] == self.accum - 1

    def forward_backward(self, x: Any, y: Any, loss_fn: Any) -> torch.Tensor | None:
        """``run.backward(loss_fn(model(x), y))``, or, pipelined, every micro-batch through the schedule.

        Returns the loss (pipelined: on the last stage; None on the others). The one call that works for
        DDP and pipelines alike::

            for x, y in run.batches(loader):
                run.forward_backward(x, y, loss_fn)
                run.step()
        """
        st, ins = self._need_prepared("forward_backward")
        if not st.pipelined:
            assert self.model is not None
            loss = loss_fn(self.model(x), y)
            self.backward(loss)
            return loss
        loss = st.pipeline_step(x, y, loss_fn, self.optimizer)
        ins.clock.add(st.pipe.busy_s[-1])  # type: ignore[union-attr]  # the stages time their own compute
        self.losses.add(loss if loss is not None else torch.zeros((), device=self.device))
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` with the loss scaler (fp16), accumulation and the instruments."""
        st, ins = self._need_prepared("backward")
        if not torch.is_tensor(loss) or loss.numel() != 1:
            shape = tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__
            raise RunError(f"run.backward: the loss must be a scalar tensor, got {shape}; reduce it (e.g. .mean())")
        loss = loss / self.accum if self.accum > 1 else loss
        scaled = st.scaler.scale(loss)
        ins.watch(scaled)
        scaled.backward()
        if st.syncs_gradients:
            st.backward_done()
        self.losses.add(loss)

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
        st = self._need_prepared("clip_gradients")[0]
        if not self._last_micro():
            return None
        if self.optimizer is None:
            raise RunError("run.clip_gradients() needs the optimizer: pass it to run.prepare(model, optimizer, ...)")
        self._sync_gradients()
        st.scaler.unscale_(self.optimizer)  # no-op scale without fp16; step() then skips unscaling again
        return st.clip_grad_norm(max_norm, norm_type)

    def no_sync(self) -> Any:
        """Context for the micro-steps of a user's own accumulation: backward inside it skips the gradient exchange.

        nanoGPT's ``model.require_backward_grad_sync = last`` as a context: wrap every micro-step but the last
        of an optimizer step; the last one's backward exchanges the summed gradients. Gradients then equal
        ``strategy.grad_accum``'s (divide each micro-step's loss by their number, as it does). Under overlap off,
        compression, local SGD and ZeRO it is the same, under FSDP it is FSDP's own (no reduce-scatter until the
        last micro-step); under a pipeline it is refused (the schedule runs the micro-batches). Leave ``strategy.grad_accum`` at 1: the two accumulations would multiply.

        Example::

            for x, y in run.batches(loader, steps=1000):          # a batch of K micro-batches
                for i, (xm, ym) in enumerate(zip(x.chunk(K), y.chunk(K))):
                    with run.no_sync() if i < K - 1 else contextlib.nullcontext():
                        run.backward(loss_fn(model(xm), ym) / K)
                run.clip_gradients(1.0)
                run.step()
        """
        st = self._need_prepared("no_sync")[0]
        if st.pipelined:
            raise RunError("run.no_sync() under a pipeline: the schedule accumulates its micro-batches itself; "
                           "use --strategy.grad_accum N and run.forward_backward instead")
        if self.accum > 1:
            raise RunError(f"run.no_sync() with strategy.grad_accum = {self.accum}: the run accumulates already; "
                           "use one or the other (grad_accum 1 with your own micro-steps)")
        return st.no_sync()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce ``tensor`` in place over every rank (collective) and return it: sum, mean, max, min, product.

        For a user's own evaluation loop; call it on every rank, outside the timed step (``run.untimed()``).

        Example::

            hits = run.all_reduce(torch.tensor([correct, seen], device=run.device))
        """
        from .reduce import all_reduce
        return all_reduce(tensor, op)

    def mean(self, value: torch.Tensor | float) -> torch.Tensor:
        """The mean of ``value`` over every rank (collective), as a new tensor on the run's device.

        Example::

            val_loss = run.mean(torch.stack(batch_losses).mean()).item()
        """
        from .reduce import mean
        return mean(value, self.device)

    def _sync_gradients(self) -> None:
        """The exchange that waits for the step (overlap off), once per optimizer step."""
        if not self._loop["synced"] and not self._loop["mode"].no_comm:
            self._need_prepared("step")[0].sync_gradients()
        self._loop["synced"] = True

    def step(self) -> bool:
        """The optimizer step (on the last micro-batch of an accumulation); returns whether one was taken."""
        st, ins = self._need_prepared("step")
        loop = self._loop
        loop["micro"] += 1
        if loop["micro"] < self.accum:
            return False
        loop["micro"] = 0
        if (job := self.flops.at_step()) is not None:
            self.points.set_flops(*job)
        ins.step_called()
        mode, opt = loop["mode"], self.optimizer
        if opt is None:
            raise RunError("run.step() needs the optimizer: pass it to run.prepare(model, optimizer, ...)")
        self._sync_gradients()  # overlap off: the exchange happens here, after backward
        loop["synced"] = False
        ins.optimizer_starts()
        st.scaler.step(opt)
        st.scaler.update()
        if not mode.no_comm:
            st.after_optimizer_step()  # local SGD's averaging: before zero_grad (it averages trained parameters)
        opt.zero_grad(set_to_none=True)
        st.end_step()
        self.step_count += 1
        ins.step_done(self.step_count - self.start_step, mode)
        self._log_point()
        return True

    def _log_point(self) -> None:
        st, ins = self._need_prepared("step")
        point = self.losses.step_done(self.step_count, self.step_count == self.total_steps, st.share_loss)
        if point is not None:
            scores = ins.monitor.scores() if ins.monitor is not None else None
            self.points.log(self.step_count, point, self.global_batch, ins.take_window_wait(), scores)

    def untimed(self) -> Any:
        """Context for work between steps that is not step time (evaluation, checkpoints)."""
        return self._need_prepared("untimed")[1].untimed()

    # ------------------------------------------------------------------ evaluation and checkpoints
    @torch.no_grad()
    def evaluate(self, data: Any, loss_fn: Any = None, batch_size: int | None = None,
                 batches: Any = None) -> dict[str, float]:
        """Exact distributed evaluation of ``(input, target)`` batches: each sample counted once, any set size.

        Returns ``loss`` (mean of ``loss_fn`` over samples; cross-entropy by default), ``samples`` and, for
        class scores against integer labels, ``accuracy``. ``batches``: this rank's device batches, already
        split (``data`` is then ignored). The last result goes into the run summary.
        """
        from .evaluate import evaluate_batches, shard_batches
        st = self._need_prepared("evaluate")[0]
        if st.averaging is not None and not self._loop["ended"] and not self._loop.get("warned_eval"):
            self._loop["warned_eval"] = True
            logger.warning("run.evaluate under local SGD before run.end_training(): each rank evaluates its own "
                           "replica, not their average; call run.end_training() first for the model you keep")
        self.guard.mark("evaluate", self.step_count)
        if batches is None:
            batches = shard_batches(data, batch_size or self.cfg.data.batch_size, self.env.rank, self.env.world_size,
                                    self.device)
        with st.whole_model():  # pipelined or FSDP: every rank evaluates its shard of the data on the whole model
            loss, acc, n = evaluate_batches(st.module, batches, self.device, st.autocast, loss_fn)
        self.eval_result = (loss, acc, n)
        return {"loss": loss, "accuracy": acc, "samples": n}

    def save(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        """Checkpoint: model, optimizer, loss scaler, strategy counters, step, loader position, every rank's RNG.

        Collective (call on every rank). ``PATH.pt``: one file, rank 0 writes atomically; any other name:
        a sharded folder (``torch.distributed.checkpoint``), each rank writes its part (asynchronously
        with ``checkpoint.async_save``). When complete, the folder's ``latest`` pointer names it. A folder
        that is unwritable or full raises CheckpointWriteError on every rank; the previous checkpoint stays.
        """
        ck = self._need_checkpointer("save")
        with self.untimed():  # writing is not step time, whoever calls it
            ck.save(path, self.step_count, extra)

    def checkpoint(self, final: bool = False, force: bool = False) -> None:
        """The periodic checkpoint into ``checkpoint.dir`` when ``checkpoint.every`` asks for one (collective).

        ``final``: the ``last`` checkpoint; ``force``: now, whatever the cadence (a preemption). A write that
        fails stops the run or, with ``checkpoint.on_error warn``, is reported and skipped; ``checkpoint.keep``
        prunes older ones. Without ``checkpoint.dir`` it does nothing.
        """
        ck = self._need_checkpointer("checkpoint")
        if self.cfg.checkpoint.dir and (final or force or ck.should_save(self.step_count)):
            with self.untimed():
                ck.save_periodic(self.step_count, final)

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
            self.step_count = self.start_step = int(state["step"])
            self.points.resumed()
        return state

    def _need_checkpointer(self, what: str) -> Checkpointer:
        self._need_prepared(what)
        assert self.checkpointer is not None
        return self.checkpointer

    # ------------------------------------------------------------------ the end
    def end_training(self) -> None:
        """After the last step (collective): loaders stopped, real modules back, local SGD's replicas averaged."""
        loop = self._loop
        if loop["ended"]:
            return
        loop["ended"] = True
        self.points.close_view()
        self.flops.close()
        if self.instruments is not None:
            self.instruments.end_steps()  # the accounting's last read, while the loader's threads still run
        self._close_io()
        if self.instruments is not None:
            self.instruments.finish(self.env.world_size)
        if self.strategy is not None:
            self.strategy.finish()

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """End the run: the summary (written to ``json_path`` / ``TRAINSCALE_JSON``, printed), then teardown."""
        if self._loop["finished"]:
            return self.summary or {}
        self.end_training()
        self.wait_for_checkpoint()
        summary = self._summary(extra or {}) if self.strategy is not None else {}
        self.summary = summary
        if self.is_main and summary:
            if self.json_path:
                write_summary(self.json_path, summary)
            if self.cfg.log.progress != "none":
                print_summary(summary)
        self._teardown(barrier=True)
        return summary

    def _summary(self, extra: dict[str, Any]) -> dict[str, Any]:
        st, ins = self._need_prepared("finish")
        rec = RunRecord(steps=self.step_count, start_step=self.start_step, global_batch=self.global_batch,
                        shards=self._shard()[1], started_at=self.started_at, restarts=self.guard.attempt,
                        steps_redone=self.guard.steps_redone(self.start_step), preempted=self.preempted,
                        eval_result=self.eval_result, out_dir=self.out_dir,
                        metrics_jsonl=self.points.written, flops=self.flops.job, peak_source=self.flops.source,
                        extra=extra)
        return build_summary(self.cfg, self.env, st, ins, self.losses, self.loaders, self.optimizer, rec)

    def _close_io(self) -> None:
        for loader in self.loaders:
            loader.close()  # the prefetch thread and the worker processes
        self.points.close()

    def _teardown(self, barrier: bool) -> None:
        self._loop["finished"] = True
        # The order (threads into c10d, then what holds a group, then the groups) is decided, and why, in
        # distributed/teardown.py; the user's prepared model keeps working on the plain module.
        end_process_group(self.owns_group, barrier, threads=[self.guard.close],
                          holders=[self.strategy, self.checkpointer, self.optimizer if self.owns_group else None])

    def _at_exit(self) -> None:
        """The exit guard's call for a run that never called ``finish()`` (no collective: a rank may be gone)."""
        if self._loop["finished"]:
            return
        if self.instruments is not None and self.instruments.monitor is not None:
            self.instruments.monitor.close(score=False)  # its thread out of the store before the groups end
        self._close_io()
        if self.checkpointer is not None:  # an asynchronous checkpoint's writer still in a collective: let it end
            try:
                self.checkpointer.wait()
            except Exception as e:
                logger.warning(f"at exit: the asynchronous checkpoint did not complete: {e}")
        self._teardown(barrier=False)

    def _need_prepared(self, what: str) -> tuple[Strategy, Instruments]:
        if self.strategy is None or self.instruments is None:
            raise RunError(f"run.{what}() needs run.prepare(model, optimizer, data) first")
        return self.strategy, self.instruments

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
