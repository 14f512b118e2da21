"""The step clock: every measured step's time, data wait, phase, and the process CPU it cost (always on)."""

from __future__ import annotations

import time

from .protocol import Instrument, StepEnd

__all__ = ["StepTimes", "CPU_EVERY"]

CPU_EVERY = 8  # measured steps per read of the process CPU clock


class StepTimes(Instrument):
    """Per measured step: its seconds, its data wait, its phase when timed, its pass through the phases.

    Process CPU seconds (every thread: intra-op, Gloo's, the loader's) per measured step: what a step costs a
    shared CPU host, whatever share of the cores the run got (the planner's input). The clock is read every
    ``CPU_EVERY`` measured steps, not each step: a read is a system call, which on a VM with Spectre mitigations
    costs the next step 12-15 us of CPU (``benchmarks/syscall_cost.py clock``); it is also read where a run of
    consecutive measured steps starts or stops (an unmeasured step, a pause, the loop's end), so work between
    steps is never counted.

    Example::

        times = StepTimes()
        times.on_step_end(StepEnd(4, True, t0, t1, 0.001, StepMode(), None))
        times.step_times   # [t1 - t0]
    """

    __slots__ = ("step_times", "waits", "marks", "cycles", "cpu_s", "cpu_steps", "cpu_prev", "unread")

    def __init__(self) -> None:
        self.step_times: list[float] = []
        self.waits: list[float] = []
        self.marks: list[str | None] = []  # per measured step: its phase when timed, else None
        self.cycles: list[int] = []  # per measured step: its pass through the phases
        self.cpu_s, self.cpu_steps, self.unread = 0.0, 0, 0  # CPU and steps read; measured steps since the last read
        self.cpu_prev: float | None = time.process_time()  # None: no run of measured steps is open

    def on_step_end(self, end: StepEnd) -> None:
        if not end.measured:
            self.cpu_prev, self.unread = time.process_time(), 0  # a run of measured steps may start here
            return
        self.step_times.append(end.t_end - end.t_start)
        self.waits.append(end.wait_s)
        self.marks.append(end.mode.phase if end.mode.timed else None)
        self.cycles.append(end.mode.cycle)
        self.unread += 1
        if self.unread >= CPU_EVERY:
            self._read()

    def _read(self) -> None:
        """Count the CPU since the last read over the measured steps since."""
        cpu = time.process_time()
        if self.cpu_prev is not None and self.unread:
            self.cpu_s += cpu - self.cpu_prev
            self.cpu_steps += self.unread
        self.cpu_prev, self.unread = cpu, 0

    def on_pause(self) -> None:
        self._read()
        self.cpu_prev = None  # the work between steps costs no step

    def on_resume(self) -> None:
        self.cpu_prev, self.unread = time.process_time(), 0

    def on_steps_end(self) -> None:
        if not self.cpu_steps:  # a short run: its only figure; a longer one leaves out its last few steps, since a
            self._read()        # script that ends by itself reaches here after its own work past the loop
        self.cpu_prev, self.unread = None, 0

    def cpu_per_step(self) -> float:
        """Process CPU seconds per measured step, read once the steps have ended (NaN before the first)."""
        return self.cpu_s / self.cpu_steps if self.cpu_steps else float("nan")
