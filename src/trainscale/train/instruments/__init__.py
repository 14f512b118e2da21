"""Instruments: what a run measures and the controlled experiments it runs, outside the step's own code.

Each instrument is built once, only when asked for, and none makes the host wait on the device
inside a step: the step timer reads the host clock, the compute clock records CUDA events read at
the end, the loss stays on the device until a log point.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...config import Config
from .accounting import NAN_ROW, Accounting, start_accounting
from .accounting_summary import merge_accounting
from .compute import ComputeClock, SleepCompute, SleepTest, SlowRank, leaf_modules
from .phases import PhasePlan, StepMode, local_phase_stats, merge_phase_stats
from .profile import OpProfiler
from .protocol import HOOKS, Instrument, RankStats, StepEnd
from .step_times import StepTimes
from .stragglers import StragglerMonitor
from .timeline import StepTimeline, write_trace

__all__ = ["Instruments", "Instrument", "StepEnd", "RankStats", "StepMode", "ComputeClock", "SleepCompute",
           "SleepTest", "SlowRank", "OpProfiler", "PhasePlan", "leaf_modules", "merge_phase_stats", "StepTimeline",
           "StepTimes", "write_trace", "Accounting", "start_accounting", "merge_accounting", "StragglerMonitor"]


class Instruments:
    """The run's instruments, driven by the run API at the step's seams: only the active ones, in one order.

    Each instrument follows ``Instrument``'s protocol; for each hook this calls the active instruments that
    override it, in the order built here (a slowed rank's sleep before the compute clock's mark, the accounting's
    read before the monitor takes its run-queue wait, the step clock before the profiler and the sleep test).
    ``accounting``: the per-rank time accounting (``log.accounting``), already started (its clock offset is
    measured collectively by ``start_accounting``); None when off.

    Example::

        ins = Instruments(cfg, env.rank, env.is_main, env.device, model, Path("out"))
        ins.forward_starts(); ins.watch(loss); loss.backward(); ins.step_called(); ins.step_done(1, StepMode())
    """

    def __init__(self, cfg: Config, rank: int, is_main: bool, device: torch.device, module: nn.Module,
                 out_dir: Path, accounting: Accounting | None = None):
        a, log = cfg.ablate, cfg.log
        self.cfg, self.device, self.rank = cfg, device, rank
        self.calib_steps = a.calibrate_steps if a.compute == "sleep" and not a.sleep_times else 0
        self.warm = log.skip_first + self.calib_steps  # steps excluded from every timing
        self.plan = PhasePlan.from_config(cfg)
        self.default_mode = StepMode(a.comm, a.data)
        self.clock = ComputeClock(device)  # always on: the summary's compute and the pipeline's stage times
        self.times = StepTimes()  # always on: the summary's step times
        self.slow = SlowRank(cfg.job.slow_factor, cfg.job.slow_from_step) \
            if rank == cfg.job.slow_rank and cfg.job.slow_factor > 1 else None
        self.sleep = SleepTest(module, device, self.calib_steps, out_dir, is_main, a.sleep_times) \
            if a.compute == "sleep" else None
        self.profiler = OpProfiler(device, rank, self.warm, out_dir) if log.profile else None
        if self.profiler is not None and not self.warm:
            self.profiler.start()
        self.timeline = StepTimeline(log.timeline_steps) if log.timeline else None
        self.accounting = accounting
        if accounting is not None:  # read the other threads once per phase block: the block's rows share a phase
            accounting.schedule(self.warm, self.plan.block if self.plan else 0)
        self.monitor: StragglerMonitor | None = None  # the live straggler monitor (``watch_stragglers``)
        self._off: list[Instrument] = []  # switched off for a while (``switch``)
        self._hooks: dict[str, list[Callable[..., Any]]] = {}
        self._activate()
        self.t_prev = time.perf_counter()
        self._wait = 0.0
        self.window_wait = 0.0  # data wait since the last log point (for metrics.jsonl)

    def _activate(self) -> None:
        """Each hook's list: the bound hooks of the active instruments that override it, in the order above."""
        order = (self.slow, self.clock, self.timeline, self.accounting, self.monitor, self.times, self.profiler,
                 self.sleep)
        self.active = [i for i in order if i is not None and i not in self._off]
        self._hooks = {h: [getattr(i, h) for i in self.active if getattr(type(i), h) is not getattr(Instrument, h)]
                       for h in HOOKS}
        self._forward, self._backward = self._hooks["on_forward_start"], self._hooks["on_backward"]
        self._called, self._optimizer = self._hooks["on_step_called"], self._hooks["on_optimizer_start"]
        self._end = self._hooks["on_step_end"]

    def switch(self, instrument: Instrument, on: bool) -> None:
        """Take an active instrument out of every hook, or put it back (a benchmark's on and off chunks)."""
        if on and instrument in self._off:
            self._off.remove(instrument)
        elif not on and instrument not in self._off:
            self._off.append(instrument)
        self._activate()

    def _call(self, hook: str, *args: Any) -> None:
        for fn in self._hooks[hook]:
            fn(*args)

    # ---- per step
    def mode(self, step: int) -> StepMode:
        """The experiment of optimizer step ``step`` (counted from this run's start)."""
        i = step - self.warm
        if self.plan is None or i < 0:
            return self.default_mode
        return StepMode.of_phase(*self.plan.at(i))

    @property
    def calibrating(self) -> bool:
        """The sleep test is still timing modules (no gradient exchange meanwhile)."""
        return self.sleep is not None and self.sleep.calibrating

    @property
    def step_times(self) -> list[float]:
        """Seconds of each measured step."""
        return self.times.step_times

    @property
    def waits(self) -> list[float]:
        """Data-wait seconds of each measured step."""
        return self.times.waits

    def data_wait(self, seconds: float) -> None:
        self._wait += seconds

    def forward_starts(self) -> None:
        now = time.perf_counter()
        for fn in self._forward:
            fn(now)

    def loop_starts(self, t: float) -> None:
        """The training loop starts at ``t`` (``time.perf_counter``): the first step's clock starts."""
        self.t_prev = t
        self._call("on_loop_start", t)

    def step_called(self) -> None:
        """``run.step()`` entered (the timeline's seam after backward; a rank's arrival without gradient hooks)."""
        if self._called:
            now = time.perf_counter()
            for fn in self._called:
                fn(now)

    def optimizer_starts(self) -> None:
        """Gradients are exchanged; the optimizer runs next (the timeline's seam)."""
        if self._optimizer:
            now = time.perf_counter()
            for fn in self._optimizer:
                fn(now)

    def watch(self, scaled_loss: torch.Tensor) -> None:
        """Before ``backward``: the slowed rank sleeps as backward starts; the clock marks the end of the graph."""
        for fn in self._backward:
            fn(scaled_loss)

    def step_done(self, step: int, mode: StepMode) -> None:
        """Optimizer step ``step`` (1-based, from this run's start) has been issued."""
        now = time.perf_counter()
        measured = step > self.warm
        end = StepEnd(step, measured, self.t_prev, now, self._wait, mode, self.clock.current() if measured else None)
        for fn in self._end:
            fn(end)
        self.window_wait += self._wait
        self._wait, self.t_prev = 0.0, now

    def take_window_wait(self) -> float:
        """Data-wait seconds since the previous call (the log point's window)."""
        w, self.window_wait = self.window_wait, 0.0
        return w

    def scores(self) -> list[float] | None:
        """Each rank's last straggler score (rank 0, with the monitor on), for metrics.jsonl."""
        return self.monitor.scores() if self.monitor is not None else None

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """Work between steps that is not step time (evaluation, checkpoints)."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def pause(self) -> None:
        """Work that is not step time starts (``untimed``; an evaluation pass the agent saw begin)."""
        self._call("on_pause")

    def resume(self) -> None:
        """Step time resumes: the next step's clock starts now."""
        self.t_prev = time.perf_counter()
        self._call("on_resume")

    def watch_stragglers(self, store: Any, world: int, attempt: int) -> None:
        """Start the live straggler monitor (every rank; rank 0 scores; needs the launcher's store)."""
        if store is not None:
            runq = self.accounting.last_runq_s if self.accounting is not None else None
            self.monitor = StragglerMonitor(store, self.rank, world, self.cfg.log.straggler_every,
                                            f"trainscale/{attempt}/stragglers", runq)
            self._activate()

    # ---- end of the run
    def end_steps(self) -> None:
        """After the last step, before the loaders stop: the accounting reads its last block, the monitor its
        last windows (its thread ends here, before any group does)."""
        self._call("on_steps_end")

    def abandon(self) -> None:
        """The run ends without ``finish()``: side threads out of the store, no collective."""
        self._call("on_abandon")

    def finish(self, world_size: int) -> None:
        """Real modules back (evaluation uses them) and the profile written."""
        self._call("on_finish", world_size)

    def summary(self) -> dict[str, Any]:
        """What the active instruments add to the run summary (rank 0's are written)."""
        out: dict[str, Any] = {}
        for instrument in self.active:
            out.update(instrument.summary())
        return out

    def timeline_rows(self) -> list[Any]:
        """This rank's timeline rows (call after ``finish``; CUDA compute events are read here)."""
        if self.timeline is None:
            return []
        return self.timeline.export(self.clock.values(), self.warm + 1)

    def local_stats(self) -> RankStats:
        """This rank's figures over its measured steps, for the summary's per-rank fields."""
        from ..summary import median_interdecile
        compute, times, acct = self.clock.values(), self.times, self.accounting
        extra = [acct.row(i, times.step_times[i], times.waits[i]) if acct is not None else list(NAN_ROW)
                 for i in range(len(times.step_times))]
        phases = local_phase_stats(times.marks, times.step_times, times.waits, compute, times.cycles, extra) \
            if self.plan else {}
        med, spread = median_interdecile(compute)
        return RankStats(compute_s=med, compute_spread=spread, step_time_s=median_interdecile(times.step_times)[0],
                         data_wait_s=median_interdecile(times.waits)[0], phases=phases, cpu_s=times.cpu_per_step(),
                         accounting=acct.report() if acct is not None else None)
