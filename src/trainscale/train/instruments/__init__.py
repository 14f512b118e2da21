"""Instruments: what a run measures and the controlled experiments it runs, outside the step's own code.

Each instrument is built once, only when asked for, and none makes the host wait on the device
inside a step: the step timer reads the host clock, the compute clock records CUDA events read at
the end, the loss stays on the device until a log point.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...config import Config
from .accounting import NAN_ROW, Accounting, start_accounting
from .accounting_summary import merge_accounting
from .compute import ComputeClock, SleepCompute, SlowRank, leaf_modules
from .phases import PhasePlan, StepMode, local_phase_stats, merge_phase_stats
from .profile import OpProfiler
from .stragglers import StragglerMonitor
from .timeline import StepTimeline, write_trace

__all__ = ["Instruments", "StepMode", "ComputeClock", "SleepCompute", "SlowRank", "OpProfiler", "PhasePlan",
           "leaf_modules", "merge_phase_stats", "StepTimeline", "write_trace", "Accounting", "start_accounting",
           "merge_accounting", "StragglerMonitor"]


class Instruments:
    """The run's instruments, driven by the run API at four points: batch taken, loss, step done, finish.

    ``accounting``: the per-rank time accounting (``log.accounting``), already started (its clock offset is
    measured collectively by ``start_accounting``); None when off.
    """

    def __init__(self, cfg: Config, rank: int, is_main: bool, device: torch.device, module: nn.Module,
                 out_dir: Path, accounting: Accounting | None = None):
        self.cfg, self.device, self.out_dir, self.is_main = cfg, device, out_dir, is_main
        a = cfg.ablate
        self.clock = ComputeClock(device)
        self.slow = SlowRank(cfg.job.slow_factor, cfg.job.slow_from_step) \
            if rank == cfg.job.slow_rank and cfg.job.slow_factor > 1 else None
        self.sleep = SleepCompute(module, device) if a.compute == "sleep" else None
        self.calib_steps = a.calibrate_steps if self.sleep and not a.sleep_times else 0
        if self.sleep and a.sleep_times:
            self.sleep.load(json.loads(Path(a.sleep_times).read_text()), device)
        elif self.sleep:
            self.sleep.start_calibration()
        self.rank = rank
        self.profiler = OpProfiler(device, rank) if cfg.log.profile else None
        if self.profiler and not cfg.log.skip_first + self.calib_steps:
            self.profiler.start()
        self.plan = PhasePlan.from_config(cfg)
        self.warm = cfg.log.skip_first + self.calib_steps  # steps excluded from every timing
        self.default_mode = StepMode(a.comm, a.data)
        self.step_times: list[float] = []
        self.waits: list[float] = []
        self.marks: list[str | None] = []  # per measured step: its phase when timed, else None
        self.cycles: list[int] = []  # per measured step: its pass through the phases
        self.artefacts: dict[str, Any] = {}
        self.timeline = StepTimeline(cfg.log.timeline_steps) if cfg.log.timeline else None
        self.accounting = accounting
        self.monitor: StragglerMonitor | None = None  # the live straggler monitor (``watch_stragglers``)
        if accounting is not None:  # read the other threads once per phase block: the block's rows share a phase
            accounting.schedule(self.warm, self.plan.block if self.plan else 0)
        self.t_prev = time.perf_counter()
        # Process CPU seconds (every thread: intra-op, Gloo's, the loader's) over the measured steps: what a
        # step costs a shared CPU host, whatever share of the cores the run got (the planner's input).
        self.cpu_s, self.cpu_prev = 0.0, time.process_time()
        self._wait = 0.0
        self.window_wait = 0.0  # data wait since the last log point (for metrics.jsonl)

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
        return self.sleep is not None and not self.sleep.installed

    def data_wait(self, seconds: float) -> None:
        self._wait += seconds

    def forward_starts(self) -> None:
        if self.slow is not None:
            self.slow.start()
        self.clock.start()
        if self.timeline is not None:
            self.timeline.forward_starts(time.perf_counter())

    def loop_starts(self, t: float) -> None:
        """The training loop starts at ``t`` (``time.perf_counter``): the first step's clock starts."""
        self.t_prev = t
        if self.accounting is not None:
            self.accounting.loop_starts(t)

    def step_called(self) -> None:
        """``run.step()`` entered (the timeline's seam after backward; a rank's arrival without gradient hooks)."""
        if self.timeline is not None or self.accounting is not None:
            now = time.perf_counter()
            if self.timeline is not None:
                self.timeline.step_called(now)
            if self.accounting is not None:
                self.accounting.step_called(now)

    def optimizer_starts(self) -> None:
        """Gradients are exchanged; the optimizer runs next (the timeline's seam)."""
        if self.timeline is not None:
            self.timeline.optimizer_starts(time.perf_counter())

    def watch(self, scaled_loss: torch.Tensor) -> None:
        """Before ``backward``: the slowed rank sleeps as backward starts; the clock marks the end of the graph."""
        if self.slow is not None:
            self.slow.watch(scaled_loss)
        self.clock.watch(scaled_loss)
        if self.calibrating:
            self.sleep.watch(scaled_loss)  # type: ignore[union-attr]

    def step_done(self, step: int, mode: StepMode) -> None:
        """Optimizer step ``step`` (1-based, from this run's start) has been issued."""
        now = time.perf_counter()
        measured = step > self.warm
        if self.slow is not None:
            self.slow.next_step(step + 1)
        compute = self.clock.current() if self.monitor is not None and measured else None
        self.clock.end_step(measured)
        if self.timeline is not None:
            self.timeline.step_done(step, self.t_prev, self._wait, now, measured)
        if self.accounting is not None:  # after ``now``: its reads are paid by the next step's time
            self.accounting.step_done(step, measured, self.t_prev)
        if compute is not None:  # after the accounting's read: this step's run-queue wait
            runq = self.accounting.last_runq_s() if self.accounting is not None else float("nan")
            self.monitor.step(step, compute, self._wait, runq)  # type: ignore[union-attr]
        cpu = time.process_time()
        if measured:
            self.cpu_s += cpu - self.cpu_prev
            self.step_times.append(now - self.t_prev)
            self.waits.append(self._wait)
            self.marks.append(mode.phase if mode.timed else None)
            self.cycles.append(mode.cycle)
            if self.profiler:
                self.profiler.step_done()
        elif step == self.warm and self.profiler:
            self.profiler.start()
        if self.calibrating:
            self.sleep.end_step()  # type: ignore[union-attr]
            if step >= self.calib_steps:
                self.sleep.install()  # type: ignore[union-attr]
                self.artefacts["sleep_times"] = self._write_sleep_times()
        self.window_wait += self._wait
        self._wait, self.t_prev, self.cpu_prev = 0.0, now, cpu

    def take_window_wait(self) -> float:
        """Data-wait seconds since the previous call (the log point's window)."""
        w, self.window_wait = self.window_wait, 0.0
        return w

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """Work between steps that is not step time (evaluation, checkpoints)."""
        if self.accounting is not None:
            self.accounting.pause()
        try:
            yield
        finally:
            self.t_prev, self.cpu_prev = time.perf_counter(), time.process_time()
            if self.accounting is not None:
                self.accounting.resume()

    def watch_stragglers(self, store: Any, world: int, attempt: int) -> None:
        """Start the live straggler monitor (every rank; rank 0 scores; needs the launcher's store)."""
        if store is not None:
            self.monitor = StragglerMonitor(store, self.rank, world, self.cfg.log.straggler_every,
                                            f"trainscale/{attempt}/stragglers")

    # ---- end of the run
    def end_steps(self) -> None:
        """After the last step, before the loaders stop: the accounting reads its last block, the monitor its
        last windows (its thread ends here, before any group does)."""
        if self.accounting is not None:
            self.accounting.end()
        if self.monitor is not None:
            self.monitor.close()

    def finish(self, world_size: int) -> None:
        """Real modules back (evaluation uses them) and the profile written."""
        if self.sleep:
            self.sleep.uninstall()
        if self.profiler:
            self.artefacts.update(self.profiler.write(self.out_dir, world_size))

    def timeline_rows(self) -> list[Any]:
        """This rank's timeline rows (call after ``finish``; CUDA compute events are read here)."""
        if self.timeline is None:
            return []
        return self.timeline.export(self.clock.values(), self.warm + 1)

    def local_stats(self) -> tuple[Any, ...]:
        """This rank's (compute median, compute spread, step median, wait median, phases, mean CPU s per step,
        accounting report or None)."""
        from ..summary import median_spread
        compute = self.clock.values()
        acct = self.accounting
        extra = [acct.row(i, self.step_times[i], self.waits[i]) if acct is not None else list(NAN_ROW)
                 for i in range(len(self.step_times))]
        phases = local_phase_stats(self.marks, self.step_times, self.waits, compute, self.cycles, extra) \
            if self.plan else {}
        cpu = self.cpu_s / len(self.step_times) if self.step_times else float("nan")
        report = acct.report() if acct is not None else None
        return (*median_spread(compute), median_spread(self.step_times)[0], median_spread(self.waits)[0], phases, cpu,
                report)

    def _write_sleep_times(self) -> str:
        path = self.out_dir / "sleep_times.json"
        if self.is_main:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.sleep.export()) + "\n")  # type: ignore[union-attr]
        return str(path)
