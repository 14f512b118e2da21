"""The step clock: every measured step's time, data wait, phase, and the process CPU it cost (always on)."""

from __future__ import annotations

import time

from .protocol import Instrument, StepEnd

__all__ = ["StepTimes"]


class StepTimes(Instrument):
    """Per measured step: its seconds, its data wait, its phase when timed, its pass through the phases.

    Process CPU seconds (every thread: intra-op, Gloo's, the loader's) are summed over the measured steps: what a
    step costs a shared CPU host, whatever share of the cores the run got (the planner's input).

    Example::

        times = StepTimes()
        times.on_step_end(StepEnd(4, True, t0, t1, 0.001, StepMode(), None))
        times.step_times   # [t1 - t0]
    """

    __slots__ = ("step_times", "waits", "marks", "cycles", "cpu_s", "cpu_prev")

    def __init__(self) -> None:
        self.step_times: list[float] = []
        self.waits: list[float] = []
        self.marks: list[str | None] = []  # per measured step: its phase when timed, else None
        self.cycles: list[int] = []  # per measured step: its pass through the phases
        self.cpu_s, self.cpu_prev = 0.0, time.process_time()

    def on_step_end(self, end: StepEnd) -> None:
        cpu = time.process_time()
        if end.measured:
            self.cpu_s += cpu - self.cpu_prev
            self.step_times.append(end.t_end - end.t_start)
            self.waits.append(end.wait_s)
            self.marks.append(end.mode.phase if end.mode.timed else None)
            self.cycles.append(end.mode.cycle)
        self.cpu_prev = cpu

    def on_resume(self) -> None:
        self.cpu_prev = time.process_time()  # the work between steps costs no step

    def cpu_per_step(self) -> float:
        """Process CPU seconds per measured step (NaN before the first)."""
        return self.cpu_s / len(self.step_times) if self.step_times else float("nan")
