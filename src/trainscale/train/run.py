"""The run API: a user's own training loop with every strategy and measurement of ``trainscale train``.

The user keeps their loop, loss, optimizer and batch structure; the run owns the process group, the
strategy (DDP, fusion, overlap, compression, local SGD, ZeRO, AMP, accumulation), the sharded input
pipeline, the instruments and the run summary. ``Trainer`` is one user of this API.

The lab switches experiments on without editing the script: ``TRAINSCALE_ARGS`` holds configuration
overrides (``--ablate.phases base,no_data,no_comm --job.steps 40``), applied after the script's own,
and ``TRAINSCALE_JSON`` names the summary file.
"""

from __future__ import annotations

import atexit
import gc
import math
import os
import random
import shlex
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, SequentialSampler, default_collate

from ..about import versions
from ..config import Config, apply_overrides, config_to_dict, parse_override_args
from ..data import DataInfo, build_train_loader, data_wait_advice
from ..data.delay import with_sample_delay
from ..data.loader import TrainLoader
from ..distributed import DistEnv, gather_env_rows, init_distributed
from ..distributed.table import print_env_table
from ..log import logger, setup_logging
from ..strategies import Strategy, apply_strategy, apply_zero, optimizer_state_dict
from .checkpoint import (
    CheckpointWriteError,
    checkpoint_candidates,
    is_sharded,
    load_checkpoint,
    publish_latest,
    save_checkpoint,
    set_rng_state,
    state_bytes,
    warn_skipped,
    write_error,
)
from .guard import Guard
from .instruments import Instruments, StepMode, merge_phase_stats, write_trace
from .metrics import MetricsLog
from .progress import ProgressView
from .summary import SCHEMA_VERSION, median_spread, print_summary, write_summary

__all__ = ["Run", "init", "RunError", "ENV_ARGS", "ENV_JSON"]

ENV_ARGS = "TRAINSCALE_ARGS"  # configuration overrides set by the lab (shell-quoted --section.field value)
ENV_JSON = "TRAINSCALE_JSON"  # where the run summary goes (set by the lab)


class RunError(ValueError):
    """The run API was used in a way it cannot work (one line that says what to change)."""


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
        self.preempted = False  # batches() stopped early on SIGTERM: save, then exit with EXIT_PREEMPTED
        self._pending: Any = None  # an asynchronous sharded checkpoint still being written
        self._ckpt_group: Any = None  # the checkpoints' own process group (async writes run beside the step)
        torch.manual_seed(cfg.job.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
        self.strategy: Strategy | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.instruments: Instruments | None = None
        self.loaders: list[Any] = []
        self.step_count = self.start_step = 0  # optimizer steps done (start_step: where this run resumed)
        self.total_steps = cfg.job.steps
        self.accum = cfg.strategy.grad_accum
        self._micro, self._mode = 0, StepMode()
        self._fixed: Any = None
        self._loss_sum: torch.Tensor | None = None
        self._window = torch.zeros((), device=self.env.device)
        self._window_n, self._window_t0, self._loop_t0 = 0, time.perf_counter(), time.perf_counter()
        self.loss_first: torch.Tensor | None = None
        self.loss_last: torch.Tensor | None = None
        self.loss_curve: list[tuple[int, float, float]] = []  # (step, seconds into the loop, loss) at log points
        self.eval_result: tuple[float, float, int] = (float("nan"), float("nan"), 0)
        self.view: ProgressView | None = None
        self.global_batch = 0
        self._ended = self._finished = False
        self._warned_nan = False
        self.summary: dict[str, Any] | None = None
        self.model: PreparedModel | None = None
        self.started_at = datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")
        self.metrics: MetricsLog | None = None  # opened at the first log point (after a resume's load)
        atexit.register(self._at_exit)  # a script that never calls finish() still leaves the group cleanly

    # ------------------------------------------------------------------ set-up
    @property
    def device(self) -> torch.device:
        return self.env.device

    @property
    def is_main(self) -> bool:
        return self.env.is_main

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
        self.strategy = apply_strategy(model, self.env, self.cfg.strategy, layers)
        if optimizer is not None and self.cfg.strategy.shard_optimizer:
            optimizer = apply_zero(optimizer)
        self.optimizer = optimizer
        self.instruments = Instruments(self.cfg, self.env.rank, self.is_main, self.device, self.strategy.module,
                                       self.out_dir)
        loader = self.loader(data, data_info) if data is not None else None
        if self.is_main:
            self._live_metrics()  # the tracker's import and set-up, before the first timed step
        rows = gather_env_rows(self.env)
        pipe = self.strategy.pipe
        if pipe is not None:
            for r in rows:
                r["stage"], r["replica"] = r["rank"] % pipe.stages, r["rank"] // pipe.stages
        self.guard.start()  # every rank has published its first beat before that collective
        if self.is_main and (pipe is not None or not os.environ.get("TRAINSCALE_TABLE_PRINTED")):
            print_env_table(rows, world=str(self.env.world_size), nodes=str(self.env.nnodes), master=self.env.master,
                            backend=self.env.backend)
        # Each rank its own stream of randomness from here (dropout, augmentation), reproducible from the seed.
        seed = self.cfg.job.seed * 1000 + self.env.rank
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        self.model = PreparedModel(self.strategy)
        return self.model, optimizer, loader

    def loader(self, data: Any, info: DataInfo | None = None) -> TrainLoader:
        """trainscale's loader over ``data`` (Dataset or DataLoader): this rank's shard, prefetched to the device."""
        if isinstance(data, TrainLoader) or hasattr(data, "state_dict") and hasattr(data, "__next__"):
            if data not in self.loaders:  # a ready loader (ours, or one with the same interface): used as it is
                self.loaders.append(data)
                bs = getattr(data, "batch_size", None) or self.cfg.data.batch_size
                self.global_batch = bs * self._shard()[1] * self.accum
            return data
        d = self.cfg.data
        kw: dict[str, Any] = {"batch_size": d.batch_size, "workers": d.workers, "collate": None, "shuffle": d.shuffle}
        if isinstance(data, DataLoader):
            collate = None if data.collate_fn is default_collate else data.collate_fn
            kw = {"batch_size": data.batch_size or d.batch_size, "workers": data.num_workers, "collate": collate,
                  "shuffle": not isinstance(data.sampler, SequentialSampler)}
            data = data.dataset
        if not isinstance(data, Dataset) and not hasattr(data, "__getitem__"):
            raise RunError(f"run.prepare/batches: data must be a Dataset or DataLoader, not {type(data).__name__}")
        data = with_sample_delay(data, d.sample_delay_ms, d.sample_delay_scope)  # the slow-disk experiment
        if info is not None:  # built-in image data: the configured loader (DALI too), normalised on the device
            dcfg = apply_overrides(self.cfg, {"data.batch_size": kw["batch_size"]}).data
            loader = build_train_loader(dcfg, data, info, self.device, *self._shard(), self.cfg.job.seed, self.is_main)
        else:
            loader = TrainLoader(data, None, self.device, kw["batch_size"], *self._shard(),
                                 kw["workers"], kw["shuffle"], self.cfg.job.seed, prefetch=d.prefetch,
                                 on_error=d.on_error, collate=kw["collate"])
        self.global_batch = loader.batch_size * self._shard()[1] * self.accum
        self.loaders.append(loader)
        return loader

    def _shard(self) -> tuple[int, int]:
        """(which shard, of how many) of the training data this rank reads: a pipeline's stages share one."""
        pipe = self.strategy.pipe if self.strategy is not None else None
        return (pipe.replica, pipe.replicas) if pipe is not None else (self.env.rank, self.env.world_size)

    # ------------------------------------------------------------------ the loop
    def batches(self, loader: Any, steps: int | None = None) -> Iterator[Any]:
        """Device batches for ``steps`` optimizer steps (x ``strategy.grad_accum`` micro-batches each).

        ``steps`` None: one epoch of this rank's shard (``job.steps`` when the lab sets it). The time
        spent waiting here is the step's data wait.
        """
        st, ins = self._need_prepared("batches")
        loader = self.loader(loader)
        self.total_steps = self.forced_steps or steps or max(1, loader.batches_per_epoch // self.accum)
        if self.view is None:
            self.view = ProgressView(self.total_steps, self.cfg.log.progress, self.is_main, start=self.step_count)
            self._window_t0 = self._loop_t0 = ins.t_prev = time.perf_counter()
        guard = self.guard
        while self.step_count < self.total_steps:
            if guard.at_boundary(self.step_count):  # one bool test unless a SIGTERM came
                self.preempted = True
                logger.warning(f"preempted (SIGTERM): stopping after step {self.step_count}")
                break
            mode = self._mode = ins.mode(self.step_count - self.start_step)
            guard.mark("data", self.step_count)
            t0 = time.perf_counter()
            if mode.no_data:
                self._fixed = self._fixed if self._fixed is not None else next(loader)
                batch = self._fixed
            else:
                batch = next(loader)
            ins.data_wait(time.perf_counter() - t0)
            guard.mark("compute", self.step_count)
            # DDP exchanges gradients in backward only on the last micro-step (set before forward).
            st.set_grad_sync(self._micro == self.accum - 1 and not mode.no_comm and not ins.calibrating,
                             comm=not mode.no_comm)
            ins.forward_starts()
            before = self.step_count * self.accum + self._micro
            yield batch
            if self.step_count * self.accum + self._micro == before:
                raise RunError("call run.step() once for every batch that run.batches() yields")

    def forward_backward(self, x: Any, y: Any, loss_fn: Any) -> torch.Tensor | None:
        """``run.backward(loss_fn(model(x), y))``, or, pipelined, every micro-batch through the schedule.

        Returns the loss (pipelined: on the last stage; None on the others). The one call that works for
        DDP and pipelines alike::

            for x, y in run.batches(loader):
                run.forward_backward(x, y, loss_fn)
                run.step()
        """
        st, ins = self._need_prepared("forward_backward")
        if st.pipe is None:
            loss = loss_fn(self.model(x), y)
            self.backward(loss)
            return loss
        loss = st.pipeline_step(x, y, loss_fn, self.optimizer)
        ins.clock.add(st.pipe.busy_s[-1])  # the stages time their own compute
        d = loss.float().reshape(()) if loss is not None else torch.zeros((), device=self.device)
        self._loss_sum = d if self._loss_sum is None else self._loss_sum + d
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
        if st.model.require_backward_grad_sync:
            st.backward_done()
        d = loss.detach().float().reshape(())
        self._loss_sum = d if self._loss_sum is None else self._loss_sum + d

    def step(self) -> bool:
        """The optimizer step (on the last micro-batch of an accumulation); returns whether one was taken."""
        st, ins = self._need_prepared("step")
        self._micro += 1
        if self._micro < self.accum:
            return False
        self._micro = 0
        ins.step_called()
        mode, opt = self._mode, self.optimizer
        if opt is None:
            raise RunError("run.step() needs the optimizer: pass it to run.prepare(model, optimizer, ...)")
        if not mode.no_comm:
            st.sync_gradients()  # overlap off: the exchange happens here, after backward
        ins.optimizer_starts()
        st.scaler.step(opt)
        st.scaler.update()
        if not mode.no_comm:
            st.after_optimizer_step()  # local SGD's averaging: before zero_grad (it averages trained parameters)
        opt.zero_grad(set_to_none=True)
        st.end_step()
        self.step_count += 1
        ins.step_done(self.step_count - self.start_step, mode)
        self._log_loss()
        return True

    def _log_loss(self) -> None:
        loss = self._loss_sum if self._loss_sum is not None else torch.zeros((), device=self.device)
        self._loss_sum = None
        if self.loss_first is None:
            self.loss_first = loss.clone()
        self.loss_last = loss
        self._window += loss
        self._window_n += 1
        if self.step_count % self.cfg.log.every and self.step_count != self.total_steps:
            return
        if self.strategy is not None and self.strategy.pipe is not None:
            self.strategy.pipe.share_loss(self._window)  # the loss lives on the last stage
        # The only host sync of the loop: metrics leave the device every log.every steps.
        mean = (self._window / self._window_n).item()
        if not math.isfinite(mean) and not self._warned_nan:
            self._warned_nan = True
            logger.warning(f"loss is {mean} at step {self.step_count}: the run diverged (lower the learning rate "
                           "or add warm-up)")
        now = time.perf_counter()
        self.loss_curve.append((self.step_count, round(now - self._loop_t0, 4), mean))
        window_s = max(now - self._window_t0, 1e-9)
        if self.view is not None:
            self.view.update(self.step_count, mean, self._window_n * self.global_batch / window_s)
        wait = self.instruments.take_window_wait() if self.instruments is not None else 0.0
        if self.is_main:
            self._live_metrics().log(self.step_count, {
                "loss": mean, "samples_per_s": self._window_n * self.global_batch / window_s,
                "step_time_s": window_s / self._window_n, "data_wait_s": wait / self._window_n,
                "time_s": now - self._loop_t0})
        self._window.zero_()
        self._window_n, self._window_t0 = 0, time.perf_counter()

    def _live_metrics(self) -> MetricsLog:
        if self.metrics is None:
            log = self.cfg.log
            folder = self.run_dir if log.metrics else None
            self.metrics = MetricsLog(folder, log.tracker, log.tracker_dir or self.out_dir,
                                      config_to_dict(self.cfg), run_name=log.run_name)
        return self.metrics

    def untimed(self) -> Any:
        """Context for work between steps that is not step time (evaluation, checkpoints)."""
        return self._need_prepared("untimed")[1].untimed()

    # ------------------------------------------------------------------ evaluation and checkpoints
    @torch.no_grad()
    def evaluate(self, data: Any, loss_fn: Any = None, batch_size: int | None = None) -> dict[str, float]:
        """Exact distributed evaluation of ``(input, target)`` batches: each sample counted once, any set size.

        Returns ``loss`` (mean of ``loss_fn`` over samples; cross-entropy by default), ``samples`` and, for
        class scores against integer labels, ``accuracy``. The last result goes into the run summary.
        """
        from ..data.sampler import eval_indices
        from .evaluate import evaluate_batches
        st = self._need_prepared("evaluate")[0]
        st.gather_model()  # pipelined: every rank evaluates its shard on the whole model
        if isinstance(data, DataLoader):
            batch_size, collate, data = batch_size or data.batch_size, data.collate_fn, data.dataset
        else:
            collate = default_collate
        bs = batch_size or self.cfg.data.batch_size
        idx = eval_indices(len(data), self.env.rank, self.env.world_size)
        from ..data.loader import move_to
        batches = (move_to(collate([data[j] for j in idx[i:i + bs]]), self.device) for i in range(0, len(idx), bs))
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
        st = self._need_prepared("save")[0]
        path = Path(path)
        self.wait_for_checkpoint()
        self.guard.mark("checkpoint", self.step_count, f"writing {path.name}")
        st.gather_model()  # one whole-model state dict, whatever the stage count
        meta = {"scaler": st.scaler.state_dict(), "strategy": st.state_dict(), "step": self.step_count,
                "loader": self.loaders[0].state_dict() if self.loaders else None,
                "world_size": self.env.world_size, "config": config_to_dict(self.cfg), **(extra or {})}
        if self.optimizer is not None:
            from .dcp import param_names
            # The optimizer state_dict names parameters by index; these names let a converter map them to DCP keys.
            meta["param_names"] = param_names(st.module, self.optimizer)
        if path.suffix == ".pt":
            opt = self.optimizer
            optim = (st.pipe.optimizer_state_dict(opt) if st.pipe is not None else
                     optimizer_state_dict(opt, self.env.rank)) if opt else {}
            state = {"model": st.module.state_dict(), "optimizer": optim, **meta}
            save_checkpoint(path, state, self.env.rank, self.env.world_size,
                            during=lambda: self.guard.in_checkpoint(self.step_count))
        else:
            self._save_sharded(path, meta)
        self.guard.mark("checkpoint", self.step_count, f"wrote {path.name}")

    def _save_sharded(self, path: Path, meta: dict[str, Any]) -> None:
        from torch.distributed.checkpoint import CheckpointException

        from .dcp import dcp_save
        st = self._need_prepared("save")[0]
        if self._ckpt_group is None and self.env.world_size > 1:
            self._ckpt_group = dist.new_group(backend="gloo")  # collective; async writes must not share the step's group
        if self.is_main:
            (path / ".metadata").unlink(missing_ok=True)  # a folder left by a crashed attempt is not complete
        self.guard.in_checkpoint(self.step_count)
        asynchronous = self.cfg.checkpoint.async_save
        try:
            fut = dcp_save(path, st.module, self.optimizer, meta, self.env.rank, self._ckpt_group, asynchronous)
        except (CheckpointException, OSError) as e:
            raise self._sharded_error(path, e, meta) from None
        if fut is None:
            if self.is_main:
                publish_latest(path)
            return
        self._pending = (path, fut, meta)
        if asynchronous and self.is_main:
            logger.debug(f"writing {path} in the background")

    def _sharded_error(self, path: Path, err: BaseException, meta: dict[str, Any]) -> CheckpointWriteError:
        from .dcp import build_state
        st = self._need_prepared("save")[0]
        needed = state_bytes(build_state(st.module, self.optimizer, meta, self.env.rank)) * self.env.world_size
        cause: BaseException = err
        for failure in getattr(err, "failures", {}).values():  # DCP gathers every rank's exception
            cause = failure[0] if isinstance(failure, tuple) else failure
            break
        while cause.__cause__ is not None and not isinstance(cause, OSError):
            cause = cause.__cause__
        return write_error(path, cause, needed)

    def wait_for_checkpoint(self) -> None:
        """Block until an asynchronous checkpoint is complete, then publish it (collective only through DCP)."""
        if self._pending is None:
            return
        path, fut, meta = self._pending
        self._pending = None
        try:
            fut.result()
        except Exception as e:
            raise self._sharded_error(path, e, meta) from None
        if self.is_main:
            publish_latest(path)

    def load(self, path: str | Path) -> dict[str, Any]:
        """Resume from ``save``'s checkpoint: the next step continues where that run stopped. Returns the state.

        ``path``: a ``.pt`` file, a sharded folder (loaded at this world size: DCP reshards), or a checkpoint
        folder, whose newest complete checkpoint is used (the one ``latest`` names; an unreadable one is
        skipped with a warning). A folder with none: nothing is loaded and ``{}`` comes back.
        """
        st = self._need_prepared("load")[0]
        target = self._choose_checkpoint(Path(path))
        if target is None:
            logger.info(f"no checkpoint in {path}: starting from step 0")
            return {}
        if is_sharded(target):
            from .dcp import dcp_load
            state = dcp_load(target, st.module, self.optimizer, self.env.rank, self._ckpt_group)
            rngs: list[Any] = []
        else:
            state = load_checkpoint(str(target))
            st.module.load_state_dict(state["model"])
            if self.optimizer is not None and state.get("optimizer"):
                self.optimizer.load_state_dict(state["optimizer"])
            rngs = state.get("rng") or []
        st.scaler.load_state_dict(state["scaler"])
        self.step_count = self.start_step = int(state["step"])
        if self.metrics is not None:
            self.metrics.append = True  # continue the interrupted run's metrics.jsonl
        st.load_state_dict(state.get("strategy") or {"steps": self.step_count})
        if state.get("world_size") != self.env.world_size:
            logger.warning(f"resuming a {state.get('world_size')}-process checkpoint on {self.env.world_size} "
                           "processes: the data order will differ from the original run")
        if self.loaders and state.get("loader"):
            self.loaders[0].load_state_dict(state["loader"])
        if self.env.rank < len(rngs):
            set_rng_state(rngs[self.env.rank])
        self.guard.record_resume(self.step_count)
        logger.info(f"resumed from {target} at step {self.step_count}")
        return state

    def _choose_checkpoint(self, path: Path) -> Path | None:
        """Rank 0 picks the newest readable checkpoint under ``path``; every rank gets its choice."""
        if path.suffix == ".pt" or is_sharded(path):
            return path
        if not path.is_dir():  # --resume auto before the first checkpoint: a fresh start
            return None
        choice: list[Any] = [None]
        if self.is_main:
            for cand in checkpoint_candidates(path):
                try:
                    if is_sharded(cand):
                        from .dcp import read_meta
                        read_meta(cand)
                    else:
                        load_checkpoint(cand)
                except Exception as e:
                    warn_skipped(cand, e)
                    continue
                choice[0] = str(cand)
                break
        if self.env.world_size > 1:
            dist.broadcast_object_list(choice, src=0)
        return Path(choice[0]) if choice[0] else None

    # ------------------------------------------------------------------ the end
    def end_training(self) -> None:
        """After the last step (collective): loaders stopped, real modules back, local SGD's replicas averaged."""
        if self._ended:
            return
        self._ended = True
        if self.view is not None:
            self.view.close()
        for loader in self.loaders:
            loader.close()  # the prefetch thread and the worker processes
        if self.instruments is not None:
            self.instruments.finish(self.env.world_size)
        if self.metrics is not None:
            self.metrics.close()
        if self.strategy is not None:
            self.strategy.finish()

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """End the run: the summary (written to ``json_path`` / ``TRAINSCALE_JSON``, printed), then teardown."""
        if self._finished:
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

    def _teardown(self, barrier: bool) -> None:
        self._finished = True
        self.guard.close()
        # DDP's reducer sits in reference cycles; left to interpreter shutdown, Gloo's threads can outlive the
        # tensors they hold and the rank aborts ("terminate called without an active exception"). Free it now
        # (the user's prepared model keeps working, on the plain module), and let no rank tear down while
        # another still talks.
        if self.strategy is not None:
            self.strategy.model = self.strategy.module
            self.strategy.tuner = None
        gc.collect()
        if dist.is_available() and dist.is_initialized():
            if barrier:
                dist.barrier()
            if self.owns_group:  # a group the caller made is the caller's to end
                dist.destroy_process_group()

    def _at_exit(self) -> None:
        if self._finished:
            return
        for loader in self.loaders:
            loader.close()
        if self.metrics is not None:
            self.metrics.close()
        self._teardown(barrier=False)  # another rank may be gone already: no collective here

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

    def _summary(self, extra: dict[str, Any]) -> dict[str, Any]:
        """The run summary (collective: every rank calls it; the schema of ``trainscale train``)."""
        cfg, env, ins, st = self.cfg, self.env, self.instruments, self.strategy
        assert ins is not None and st is not None
        nan = torch.full((), float("nan"), device=env.device)
        losses = torch.stack([self.loss_first if self.loss_first is not None else nan,
                              self.loss_last if self.loss_last is not None else nan]).float()
        if st.pipe is not None:
            st.pipe.share_loss(losses)  # every stage of a replica reports its last stage's loss
        dist.all_reduce(losses)  # the loss over the global batch, not rank 0's share
        losses /= env.world_size
        med, spread = median_spread(ins.step_times)
        total_t = sum(ins.step_times)
        per_rank: list[Any] = [None] * env.world_size
        dist.all_gather_object(per_rank, ins.local_stats())  # all-reduce equalises step times; compute shows who is slow
        # The slowest rank's input pipeline bounds the job: its rate x world size; skipped images summed.
        loader = self.loaders[0] if self.loaders else None
        rate = torch.tensor([float(loader.samples_per_s) if loader else float("nan")], device=env.device)
        dist.all_reduce(rate, op=dist.ReduceOp.MIN)
        skipped = torch.tensor([float(getattr(loader, "skipped", 0))], device=env.device)
        dist.all_reduce(skipped)
        wait_frac = (sum(ins.waits) / total_t) if total_t else float("nan")
        advice = data_wait_advice(wait_frac, cfg.data)
        if advice and env.is_main and not cfg.ablate.data:
            logger.warning(advice)
        eval_loss, eval_acc, eval_n = self.eval_result
        a = cfg.ablate
        timeline = self._write_timeline()
        out = {
            "schema_version": SCHEMA_VERSION, "versions": versions(), "started_at": self.started_at,
            "host": socket.gethostname(), "world_size": env.world_size, "backend": env.backend, "device": env.device.type,
            "model": type(st.module).__name__, "data": "user",
            "batch_size": loader.batch_size if loader else cfg.data.batch_size, "grad_accum": self.accum,
            "global_batch": self.global_batch, "steps": self.step_count, "measured_steps": len(ins.step_times),
            "samples_per_s": len(ins.step_times) * self.global_batch / total_t if total_t else float("nan"),
            "step_time_s": med, "step_time_spread": spread,
            "data_wait_frac": wait_frac, "data_samples_per_s": rate.item() * self._shard()[1],
            "data_skipped": int(skipped.item()),
            "loss_first": losses[0].item(), "loss_last": losses[1].item(),
            "eval_loss": eval_loss, "eval_accuracy": eval_acc, "eval_samples": eval_n,
            "bucket_mb": cfg.strategy.bucket_mb, "overlap": cfg.strategy.overlap, "amp": cfg.strategy.amp,
            "threads": env.threads, "ablate": {"comm": a.comm, "data": a.data, "compute": a.compute},
            "phases": merge_phase_stats([r[4] for r in per_rank], self.global_batch) if ins.plan else None,
            "rank_compute_s": [r[0] for r in per_rank], "rank_compute_spread": [r[1] for r in per_rank],
            "rank_step_time_s": [r[2] for r in per_rank], "rank_data_wait_s": [r[3] for r in per_rank],
            "rank_cpu_s": [r[5] for r in per_rank],
            "compute_s": per_rank[0][0], "slow_rank": cfg.job.slow_rank, "slow_factor": cfg.job.slow_factor,
            "calibrated_compute_s": (ins.sleep.total_fwd_s + ins.sleep.total_bwd_s) if ins.sleep else None,
            "restarts": self.guard.attempt, "steps_redone": self.guard.steps_redone(self.start_step),
            "resumed_from_step": self.start_step, "preempted": self.preempted,
            "wall_s": time.perf_counter() - self._loop_t0, "config": config_to_dict(cfg), "loss_curve": self.loss_curve,
            "strategy": {k: getattr(cfg.strategy, k) for k in ("hierarchical", "compression", "comm_groups",
                                                                "local_sgd_period", "local_sgd_warmup", "shard_optimizer")},
        }
        if timeline:
            out["timeline"] = timeline
        if self.metrics is not None and self.metrics.written is not None:
            out["metrics_jsonl"] = str(self.metrics.written)
        if self.optimizer is not None:
            out.update(st.report(self.optimizer, cfg.log.skip_first, a.comm))
        out.update(ins.artefacts)
        out.update(extra)
        return out


    def _write_timeline(self) -> str:
        """Gather every rank's timeline rows; rank 0 writes timeline.json (collective when log.timeline)."""
        ins = self.instruments
        if ins is None or ins.timeline is None:
            return ""
        rows: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(rows, ins.timeline_rows())
        path = self.out_dir / "timeline.json"
        if self.is_main:
            write_trace(path, rows, {"world_size": self.env.world_size, "backend": self.env.backend,
                                     "started_at": self.started_at})
            logger.info(f"timeline of {len(rows[0])} steps x {len(rows)} ranks written to {path} "
                        "(open it in https://ui.perfetto.dev)")
        return str(path)


class PreparedModel(nn.Module):
    """The user's model as the strategy runs it: forward goes through DDP (and autocast) while training.

    A stable handle: ``bucket_mb auto`` may re-wrap the module in a new DDP mid-run. ``state_dict``,
    ``parameters`` and attributes are the user's own module's (no ``module.`` prefix in checkpoints).
    In eval mode or under ``no_grad`` the module runs directly: no collective, so uneven eval shards cannot hang.
    """

    def __init__(self, strategy: Strategy):
        super().__init__()
        object.__setattr__(self, "_strategy", strategy)  # not a submodule: the parameters are the module's

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        st = self._strategy
        training = self.training and torch.is_grad_enabled()
        if training and st.pipe is not None:
            raise RunError("a pipelined model trains through run.forward_backward(x, y, loss_fn), which runs the "
                           "schedule's micro-batches; call it instead of model(x) and run.backward")
        net = st.model if training else st.module
        with st.autocast():
            out = net(*args, **kwargs)
        return _to_float(out) if st.amp else out

    @property
    def module(self) -> nn.Module:
        return self._strategy.module

    def no_sync(self) -> Any:
        return self._strategy.no_sync()

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        return self._strategy.module.parameters(recurse)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Parameter]]:
        return self._strategy.module.named_parameters(*args, **kwargs)

    def buffers(self, recurse: bool = True) -> Iterator[torch.Tensor]:
        return self._strategy.module.buffers(recurse)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._strategy.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self._strategy.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def train(self, mode: bool = True) -> PreparedModel:
        self._strategy.module.train(mode)
        return super().train(mode)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._strategy.module, name)


def _to_float(out: Any) -> Any:
    """Mixed-precision outputs back to float32, so the user's loss is computed in full precision."""
    if torch.is_tensor(out):
        return out.float() if out.is_floating_point() and out.dtype != torch.float32 else out
    if isinstance(out, dict):
        return {k: _to_float(v) for k, v in out.items()}
    if isinstance(out, (list, tuple)) and not hasattr(out, "_fields"):
        return type(out)(_to_float(v) for v in out)
    return out
