"""The one protocol every instrument follows: hooks at the step's seams, each a no-op unless overridden.

``Instruments`` calls, for each hook, only the active instruments that override it, in one fixed order, so an
instrument that is off costs nothing and one that is on costs its own work. Lightning's ``Callback`` is the
model; the difference is that the hooks here stay inside the step and must not make the host wait on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .phases import StepMode

__all__ = ["Instrument", "StepEnd", "RankStats", "HOOKS"]

HOOKS = ("on_loop_start", "on_forward_start", "on_backward", "on_step_called", "on_optimizer_start",
         "on_step_end", "on_pause", "on_resume", "on_steps_end", "on_abandon", "on_finish")


class StepEnd:
    """What an instrument learns when an optimizer step has been issued (one object per step, no copies)."""

    __slots__ = ("step", "measured", "t_start", "t_end", "wait_s", "mode", "compute")

    def __init__(self, step: int, measured: bool, t_start: float, t_end: float, wait_s: float, mode: StepMode,
                 compute: Any):
        self.step = step  # 1-based, counted from this run's start
        self.measured = measured  # past the warm-up: its times count
        self.t_start, self.t_end = t_start, t_end  # time.perf_counter at the previous step's end and at this one's
        self.wait_s = wait_s  # the step's data wait
        self.mode = mode  # the step's experiment switches
        self.compute = compute  # measured steps: forward + backward seconds, or on CUDA its (start, end) events


class Instrument:
    """Something a run measures, or an experiment it runs, driven at the step's seams (every hook optional).

    Example::

        class Counter(Instrument):
            def __init__(self):
                self.steps = 0

            def on_step_end(self, end: StepEnd) -> None:
                self.steps += end.measured
    """

    __slots__ = ()

    def on_loop_start(self, t: float) -> None:
        """The training loop starts at ``t`` (``time.perf_counter``)."""

    def on_forward_start(self, t: float) -> None:
        """A micro-batch's forward starts."""

    def on_backward(self, scaled_loss: torch.Tensor) -> None:
        """Just before ``backward`` of ``scaled_loss``: hooks on its graph go here."""

    def on_step_called(self, t: float) -> None:
        """``run.step()`` entered: backward has returned."""

    def on_optimizer_start(self, t: float) -> None:
        """Gradients are exchanged; the optimizer runs next."""

    def on_step_end(self, end: StepEnd) -> None:
        """An optimizer step has been issued."""

    def on_pause(self) -> None:
        """Work that is not step time starts (evaluation, a checkpoint)."""

    def on_resume(self) -> None:
        """That work is over; steps resume."""

    def on_steps_end(self) -> None:
        """After the last step, while the loaders still run: last reads, side threads ended."""

    def on_abandon(self) -> None:
        """The run ends without ``finish()``: side threads out, no collective (a rank may be gone)."""

    def on_finish(self, world_size: int) -> None:
        """The run is over: write artefacts, give real modules back."""

    def summary(self) -> dict[str, Any]:
        """Fields this instrument adds to the run summary (rank 0's are written)."""
        return {}


@dataclass(frozen=True)
class RankStats:
    """One rank's figures over its measured steps, gathered from every rank into the summary's ``rank_*`` fields."""

    compute_s: float  # median forward + backward seconds
    compute_spread: float  # (p90 - p10) / median of those
    step_time_s: float  # median step seconds
    data_wait_s: float  # median data wait seconds
    phases: dict[str, Any]  # the paired experiments' per-phase figures ({} without a phase plan)
    cpu_s: float  # process CPU seconds per measured step
    accounting: dict[str, Any] | None  # the time accounting's report (None when off)

