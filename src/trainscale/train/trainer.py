"""The training loop: one process per device, synchronous data parallelism, exact evaluation.

Usable from plain Python (``Trainer(cfg, model=my_module).fit()``) and what ``trainscale train`` runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from ..config import Config, ConfigError, config_to_dict
from ..data import DataInfo, build_datasets, build_train_loader, data_wait_advice, eval_batches
from ..data.delay import with_sample_delay
from ..dist import DistEnv, gather_env_rows, init_distributed
from ..dist.table import print_env_table
from ..log import logger, setup_logging
from ..models import build_model
from ..strategies import (Prepared, allreduce_after_backward, apply_strategy, apply_zero, bucket_count,
                          optimizer_state_dict)
from ..strategies.report import strategy_summary
from .checkpoint import load_checkpoint, save_checkpoint, set_rng_state
from .evaluate import evaluate
from .instrument import ComputeClock, SleepCompute
from .phases import PHASE_FLAGS, PhasePlan, local_phase_stats, merge_phase_stats
from .profile import OpProfiler
from .progress import ProgressView
from .schedule import lr_at
from .summary import median_spread, print_summary, write_summary

__all__ = ["Trainer", "prepare", "build_optimizer"]


def build_optimizer(params: Any, cfg: Config) -> torch.optim.Optimizer:
    """The optimizer named by ``optim.name`` (its rate is set every step by the schedule).

    On CUDA it is PyTorch's fused implementation: one kernel per step, and with fp16 the loss scaler
    hands it the overflow flag on the device instead of reading it on the host every step.
    """
    o = cfg.optim
    params = list(params)
    fused = bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)
    kw = {"fused": True} if fused else {}
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, **kw)
    return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, **kw)


def prepare(model: nn.Module, cfg: Config | None = None) -> tuple[nn.Module, DistEnv]:
    """Join the process group and wrap a user's model with the configured strategy.

    For a user's own loop::

        model, env = trainscale.prepare(MyNet())
        # ... forward/backward/step as usual; gradients are averaged across ranks by DDP
    """
    cfg = cfg or Config()
    for key in ("local_sgd_period", "shard_optimizer"):  # they act in the Trainer's step, not in the model
        if getattr(cfg.strategy, key):
            raise ConfigError(f"strategy.{key}", getattr(cfg.strategy, key), "needs trainscale.Trainer; not in prepare()")
    env = init_distributed(cfg.job)
    return apply_strategy(model, env, cfg.strategy).model, env


def _infer_info(ds: Dataset) -> DataInfo:
    x, _ = ds[0]
    labels = getattr(ds, "labels", None)
    classes = int(labels.max()) + 1 if torch.is_tensor(labels) else 10
    c = x.shape[0] if x.dim() >= 3 else 1
    return DataInfo(tuple(x.shape), classes, (0.0,) * c, (1.0,) * c)


class Trainer:
    """Train ``cfg.model`` (or ``model``) on ``cfg.data`` (or ``train_data``) with the configured strategy."""

    def __init__(self, cfg: Config | None = None, model: nn.Module | None = None,
                 train_data: Dataset | None = None, eval_data: Dataset | None = None,
                 data_info: DataInfo | None = None, resume: str | None = None, json_path: str | None = None):
        self.cfg = cfg or Config()
        self.user_model, self.train_data, self.eval_data, self.info = model, train_data, eval_data, data_info
        self.resume, self.json_path = resume, json_path

    # ------------------------------------------------------------------------------------ set-up

    def _setup(self) -> None:
        cfg = self.cfg
        setup_logging(cfg.log.level)
        self.env = env = init_distributed(cfg.job)
        torch.manual_seed(cfg.job.seed)  # same init on every rank (DDP also broadcasts rank 0's)
        if self.train_data is None:
            self.train_data, self.eval_data, self.info = build_datasets(cfg.data)
        self.info = self.info or _infer_info(self.train_data)
        self.train_data = with_sample_delay(self.train_data, cfg.data.sample_delay_ms, cfg.data.sample_delay_scope)
        model = self.user_model or build_model(cfg.model.name, self.info.in_shape, self.info.num_classes,
                                               cfg.model.width, cfg.model.depth)
        state = load_checkpoint(self.resume) if self.resume else None
        if state is not None:
            model.load_state_dict(state["model"])
        self.p: Prepared = apply_strategy(model, env, cfg.strategy)
        self.opt = build_optimizer(self.p.module.parameters(), cfg)
        if cfg.strategy.shard_optimizer:
            self.opt = apply_zero(self.opt)
        # Measurement and controlled experiments (the doctor's ablations and injected faults).
        self.clock = ComputeClock(env.device, cfg.job.slow_factor if env.rank == cfg.job.slow_rank else 1.0)
        self.sleep_test = SleepCompute(self.p.module, env.device) if cfg.ablate.compute == "sleep" else None
        self.calib_steps = cfg.ablate.calibrate_steps if self.sleep_test and not cfg.ablate.sleep_times else 0
        if self.sleep_test and cfg.ablate.sleep_times:
            self.sleep_test.load(json.loads(Path(cfg.ablate.sleep_times).read_text()), env.device)
        elif self.sleep_test:
            self.sleep_test.start_calibration()
        self.profiler = OpProfiler(env.device) if cfg.log.profile and env.is_main else None
        self.global_batch = cfg.data.batch_size * env.world_size * cfg.strategy.grad_accum
        self.loader = build_train_loader(cfg.data, self.train_data, self.info, env.device, env.rank,
                                         env.world_size, cfg.job.seed, env.is_main)
        self.step = 0
        if state is not None:
            self._restore(state)
        # Each rank its own stream of randomness (dropout, augmentation), reproducible from the seed.
        if state is None:
            torch.manual_seed(cfg.job.seed * 1000 + env.rank)
            random.seed(cfg.job.seed * 1000 + env.rank)
            np.random.seed(cfg.job.seed * 1000 + env.rank)
        rows = gather_env_rows(env)
        if env.is_main and not os.environ.get("TRAINSCALE_TABLE_PRINTED"):
            print_env_table(rows, world=str(env.world_size), nodes=str(env.nnodes), master=env.master,
                            backend=env.backend)

    def _restore(self, state: dict[str, Any]) -> None:
        self.opt.load_state_dict(state["optimizer"])
        self.p.scaler.load_state_dict(state["scaler"])
        self.step = int(state["step"])
        self.p.resume_at(self.step)
        if state.get("world_size") != self.env.world_size:
            logger.warning(f"resuming a {state.get('world_size')}-process checkpoint on {self.env.world_size} "
                           "processes: the data order will differ from the original run")
        self.loader.load_state_dict(state["loader"])
        rngs = state.get("rng") or []
        if self.env.rank < len(rngs):
            set_rng_state(rngs[self.env.rank])
        logger.info(f"resumed from {self.resume} at step {self.step}")

    # ------------------------------------------------------------------------------------ step

    def _train_step(self, no_comm: bool, no_data: bool) -> tuple[torch.Tensor, float, int]:
        """One optimizer step over ``grad_accum`` micro-batches; returns (loss, data wait s, all-reduce calls).

        ``no_comm`` / ``no_data`` are this step's ablations (``ablate.comm`` / ``ablate.data``, or its phase).
        """
        cfg, p = self.cfg, self.p
        s = cfg.strategy
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.step, cfg.optim, self.global_batch, cfg.job.steps)
        wait, loss_sum = 0.0, None
        calibrating = self.sleep_test is not None and not self.sleep_test.installed
        # Without communication (or while the sleep test times modules) DDP's forward is bypassed too:
        # no gradient hooks fire and no buffers are broadcast.
        net = p.module if no_comm or calibrating else p.model
        for micro in range(s.grad_accum):
            t0 = time.perf_counter()
            if no_data:
                if self._fixed_batch is None:
                    self._fixed_batch = next(self.loader)
                x, y = self._fixed_batch
            else:
                x, y = next(self.loader)
            wait += time.perf_counter() - t0
            # DDP exchanges gradients in backward only on the last micro-step, and only with overlap on.
            sync = micro == s.grad_accum - 1 and s.overlap and not no_comm
            self.clock.start()
            with (contextlib.nullcontext() if sync else p.model.no_sync()):
                with p.autocast():
                    loss = nn.functional.cross_entropy(net(x).float(), y) / s.grad_accum
                scaled = p.scaler.scale(loss)
                self.clock.watch(scaled)
                if calibrating:
                    self.sleep_test.watch(scaled)  # type: ignore[union-attr]
                scaled.backward()
            if sync:
                p.meter.backward_done()
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        calls = 0
        if p.post_backward and not no_comm:
            t0 = time.perf_counter()
            calls = allreduce_after_backward(p.post_backward, self.env.world_size)
            p.meter.exposed(time.perf_counter() - t0)
        p.scaler.step(self.opt)
        p.scaler.update()
        if p.post_step is not None and not no_comm:
            p.post_step()  # local SGD's model averaging: needs the grads (it averages only trained parameters)
        self.opt.zero_grad(set_to_none=True)
        p.meter.end_step()
        return loss_sum, wait, calls  # type: ignore[return-value]

    # ------------------------------------------------------------------------------------ loop

    def fit(self) -> dict[str, Any]:
        """Run to ``job.steps``, evaluate, checkpoint, and return (and write) the run summary."""
        t_start = time.perf_counter()
        self._setup()
        cfg, env = self.cfg, self.env
        self._fixed_batch, self._warned_nan = None, False
        start_step = self.step
        view = ProgressView(cfg.job.steps, cfg.log.progress, env.is_main, start=start_step)
        step_times, waits, calls = [], [], 0
        plan = PhasePlan.from_config(cfg)
        marks: list[str | None] = []  # per measured step: its phase when timed (ablate.phases), else None
        loss_first = loss_last = None
        window_loss = torch.zeros((), device=env.device)
        window_n, window_t0 = 0, time.perf_counter()
        t_prev = loop_t0 = time.perf_counter()
        self._loss_curve: list[tuple[int, float, float]] = []  # (step, seconds into the loop, loss) at log points
        warm = cfg.log.skip_first + self.calib_steps  # steps excluded from every timing
        artefacts: dict[str, Any] = {}
        try:
            while self.step < cfg.job.steps:
                if self.profiler and self.step - start_step == warm:
                    self.profiler.start()
                i = self.step - start_step - warm  # index among the measured steps (< 0 in warm-up)
                phase, timed = plan.at(i) if plan and i >= 0 else (None, False)
                no_comm, no_data = PHASE_FLAGS[phase] if phase else (cfg.ablate.comm, cfg.ablate.data)
                loss, wait, post_calls = self._train_step(no_comm, no_data)
                self.step += 1
                if self.p.tuner is not None and self.p.tuner.active:
                    self.p.tuner.after_step()  # bucket_mb auto: may re-wrap the model in a new DDP
                now = time.perf_counter()
                measured = self.step - start_step > warm
                self.clock.end_step(measured)
                if measured:
                    step_times.append(now - t_prev)
                    waits.append(wait)
                    marks.append(phase if timed else None)
                    if self.profiler:
                        self.profiler.step_done()
                if self.sleep_test and not self.sleep_test.installed:
                    self.sleep_test.end_step()
                    if self.step - start_step >= self.calib_steps:
                        self.sleep_test.install()
                        artefacts["sleep_times"] = self._write_sleep_times()
                t_prev = now
                if loss_first is None:
                    loss_first = loss.clone()
                loss_last = loss
                window_loss += loss
                window_n += 1
                if self.step == start_step + self.calib_steps + 2:  # DDP has rebuilt its buckets after the first step
                    calls = post_calls or (0 if cfg.ablate.comm else bucket_count(self.p.model))
                if self.step % cfg.log.every == 0 or self.step == cfg.job.steps:
                    # The only host sync of the loop: metrics leave the device every log.every steps.
                    mean_loss = (window_loss / window_n).item()
                    if not math.isfinite(mean_loss) and not self._warned_nan:
                        self._warned_nan = True
                        logger.warning(f"loss is {mean_loss} at step {self.step}: the run diverged "
                                       f"(lower --optim.lr, now {cfg.optim.lr:g}, or add --optim.warmup_steps)")
                    elapsed = time.perf_counter() - window_t0
                    self._loss_curve.append((self.step, round(time.perf_counter() - loop_t0, 4), mean_loss))
                    view.update(self.step, mean_loss, window_n * self.global_batch / max(elapsed, 1e-9))
                    window_loss.zero_()
                    # The clock is not reset: on CUDA the sync above waits for queued steps, which is
                    # training time and belongs in the next measured interval.
                    window_n, window_t0 = 0, time.perf_counter()
                if cfg.job.eval_every and self.step % cfg.job.eval_every == 0 and self.step < cfg.job.steps:
                    self._evaluate(view)
                    t_prev = time.perf_counter()  # evaluation is not step time
                if cfg.checkpoint.dir and cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                    self._checkpoint()
                    t_prev = time.perf_counter()
        finally:
            view.close()
            self.loader.close()  # stop the prefetch thread and the worker processes
            if self.sleep_test:
                self.sleep_test.uninstall()  # evaluation runs the real modules
        if self.profiler:
            artefacts.update(self._write_profile())
        if self.p.post_train is not None:
            self.p.post_train()  # local SGD: replicas averaged once more, so eval and checkpoint see one model
        if calls == 0 and self.step - start_step == 1 and not cfg.ablate.comm:
            calls = bucket_count(self.p.model) if not self.p.post_backward else len(self.p.post_backward)
        eval_loss, eval_acc, eval_n = self._evaluate(None)
        if cfg.checkpoint.dir:
            self._checkpoint(final=True)
        summary = self._summary(step_times, waits, marks if plan else None, calls, loss_first, loss_last, eval_loss,
                                eval_acc, eval_n, time.perf_counter() - t_start)
        summary.update(artefacts)
        if env.is_main:
            if self.json_path:
                write_summary(self.json_path, summary)
            if cfg.log.progress != "none":
                print_summary(summary)
        return summary

    def _artefact_dir(self) -> Path:
        return Path(self.cfg.job.out or (Path(self.json_path).parent if self.json_path else "."))

    def _write_sleep_times(self) -> str:
        """Rank 0's calibrated module durations, reusable by another run through ``ablate.sleep_times``."""
        path = self._artefact_dir() / "sleep_times.json"
        if self.env.is_main:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.sleep_test.export()) + "\n")  # type: ignore[union-attr]
        return str(path)

    def _write_profile(self) -> dict[str, str]:
        """Rank 0's per-operator table, into job.out, else beside the summary JSON, else here."""
        return self.profiler.write(self._artefact_dir(), self.env.world_size)  # type: ignore[union-attr]

    def _evaluate(self, view: ProgressView | None) -> tuple[float, float, int]:
        if self.eval_data is None or len(self.eval_data) == 0:
            return float("nan"), float("nan"), 0
        batches = eval_batches(self.eval_data, self.info, self.env.device, self.cfg.data.batch_size,
                               self.env.rank, self.env.world_size)
        loss, acc, n = evaluate(self.p.module, batches, self.env.device, self.p.autocast)
        logger.info(f"eval at step {self.step}: loss {loss:.4f}  accuracy {acc:.4f}  ({n} samples)")
        return loss, acc, n

    def _checkpoint(self, final: bool = False) -> None:
        ck = self.cfg.checkpoint
        state = {"model": self.p.module.state_dict(), "optimizer": optimizer_state_dict(self.opt, self.env.rank),
                 "scaler": self.p.scaler.state_dict(), "step": self.step, "loader": self.loader.state_dict(),
                 "world_size": self.env.world_size, "config": config_to_dict(self.cfg)}
        folder = Path(ck.dir)
        path = folder / ("last.pt" if final else f"step_{self.step}.pt")
        save_checkpoint(path, state, self.env.rank, self.env.world_size)
        if self.env.is_main and not final:
            old = sorted(folder.glob("step_*.pt"), key=lambda q: int(q.stem.split("_")[1]))
            for q in old[:-ck.keep]:
                q.unlink(missing_ok=True)
            logger.debug(f"checkpoint written: {path}")

    def _summary(self, step_times: list[float], waits: list[float], marks: list[str | None] | None, calls: int,
                 loss_first: Any, loss_last: Any, eval_loss: float, eval_acc: float, eval_n: int,
                 wall: float) -> dict[str, Any]:
        cfg, env = self.cfg, self.env
        losses = torch.stack([loss_first, loss_last]).float() if loss_first is not None else \
            torch.full((2,), float("nan"), device=env.device)
        dist.all_reduce(losses)  # the loss over the global batch, not rank 0's share
        losses /= env.world_size
        med, spread = median_spread(step_times)
        total_t = sum(step_times)
        # Per-rank medians: all-reduce equalises step times, compute times show who is slow.
        compute = self.clock.values()
        phases = local_phase_stats(marks, step_times, waits, compute) if marks is not None else {}
        mine = (*median_spread(compute), med, median_spread(waits)[0], phases)
        per_rank: list[Any] = [None] * env.world_size
        dist.all_gather_object(per_rank, mine)
        # The slowest rank's input pipeline bounds the job: its rate x world size; skipped images summed.
        rate = torch.tensor([float(self.loader.samples_per_s)], device=env.device)
        dist.all_reduce(rate, op=dist.ReduceOp.MIN)
        skipped = torch.tensor([float(self.loader.skipped)], device=env.device)
        dist.all_reduce(skipped)
        wait_frac = (sum(waits) / total_t) if total_t else float("nan")
        advice = data_wait_advice(wait_frac, cfg.data)
        if advice and env.is_main and not cfg.ablate.data:
            logger.warning(advice)
        return {
            "world_size": env.world_size, "backend": env.backend, "device": env.device.type,
            "model": cfg.model.name if self.user_model is None else type(self.user_model).__name__,
            "data": cfg.data.name if self.info is not None else "user", "batch_size": cfg.data.batch_size,
            "grad_accum": cfg.strategy.grad_accum, "global_batch": self.global_batch, "steps": self.step,
            "measured_steps": len(step_times),
            "samples_per_s": len(step_times) * self.global_batch / total_t if total_t else float("nan"),
            "step_time_s": med, "step_time_spread": spread,
            "data_wait_frac": wait_frac, "data_samples_per_s": rate.item() * env.world_size,
            "data_skipped": int(skipped.item()),
            "loss_first": losses[0].item(), "loss_last": losses[1].item(),
            "eval_loss": eval_loss, "eval_accuracy": eval_acc, "eval_samples": eval_n,
            "allreduce_calls_per_step": calls, "bucket_mb": cfg.strategy.bucket_mb,
            "overlap": cfg.strategy.overlap, "amp": cfg.strategy.amp, "threads": env.threads,
            "ablate": {"comm": cfg.ablate.comm, "data": cfg.ablate.data, "compute": cfg.ablate.compute},
            "phases": merge_phase_stats([r[4] for r in per_rank], self.global_batch) if marks is not None else None,
            "rank_compute_s": [r[0] for r in per_rank], "rank_compute_spread": [r[1] for r in per_rank],
            "rank_step_time_s": [r[2] for r in per_rank], "rank_data_wait_s": [r[3] for r in per_rank],
            "compute_s": per_rank[0][0], "slow_rank": cfg.job.slow_rank, "slow_factor": cfg.job.slow_factor,
            "calibrated_compute_s": (self.sleep_test.total_fwd_s + self.sleep_test.total_bwd_s)
            if self.sleep_test else None,
            "wall_s": wall, "config": config_to_dict(cfg), "loss_curve": self._loss_curve,
            **strategy_summary(self.p, self.opt, cfg, calls),  # comm bytes/wait, optimizer memory, autotune
        }
