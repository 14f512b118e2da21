"""The run's shared state: where its loop stands, what every step records, and what its components are given.

Holders, no logic. The run's components (the feed of batches, the stepper, the checkpointer, the end) are
built with a ``RunContext`` and, once ``run.prepare`` has made them, the ``Prepared`` parts; they read and
move these instead of calling back into the run, so none of them imports ``run.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..distributed import DistEnv
from ..strategies import Strategy
from .instruments import Instruments, StepMode
from .instruments.flops import FlopMeter
from .instruments.losses import LossWindow
from .report.logpoints import LogPoints
from .survive.guard import Guard

__all__ = ["RunState", "Meters", "RunContext", "Prepared", "now_iso"]


def now_iso() -> str:
    """This moment in local time, to the second (the summary's ``started_at``)."""
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


@dataclass
class RunState:
    """Where the run stands: the counters that its batches, step, checkpoints and summary share.

    Example::

        state = RunState(total_steps=cfg.job.steps)
        state.step_count += 1
    """

    total_steps: int  # optimizer steps the loop goes to
    forced_steps: int | None = None  # job.steps set by the lab's TRAINSCALE_ARGS: wins over the script's steps
    step_count: int = 0  # optimizer steps done
    start_step: int = 0  # where this run resumed (0 on a fresh run)
    micro: int = 0  # micro-batches of the current optimizer step taken so far
    mode: StepMode = field(default_factory=StepMode)  # this step's experiment switches
    fixed: Any = None  # the one batch kept on the device (ablate.data no_data)
    synced: bool = False  # this step's gradients are exchanged (overlap off: once, by clip_gradients or step)
    preempted: bool = False  # batches() stopped early on SIGTERM: save, then exit with EXIT_PREEMPTED
    ended: bool = False  # end_training() ran
    finished: bool = False  # finish() or the exit guard ran: the process groups are ended
    started_at: str = field(default_factory=now_iso)

    def last_micro(self, accum: int) -> bool:
        """Whether the current micro-batch ends an optimizer step of ``accum`` micro-batches."""
        return self.micro == accum - 1


@dataclass
class Meters:
    """What every step feeds and the summary reads, built with the run: loss window, FLOP meter, log points.

    Example::

        meters = Meters(LossWindow(device, cfg.log.every), FlopMeter(device, cfg.strategy.amp), points)
        meters.losses.add(loss)
    """

    losses: LossWindow
    flops: FlopMeter  # model FLOPs and the device's peak, for MFU
    points: LogPoints  # the progress line, metrics.jsonl and the tracker


@dataclass
class RunContext:
    """What every component of one run is given when it is built: the configuration, this rank's process
    environment, the guard, the loop's counters, the meters and the folder for artefacts.

    Example::

        ctx = RunContext(cfg, env, Guard(cfg, env), RunState(cfg.job.steps), meters, Path("out"))
        feed = Feed(ctx)
    """

    cfg: Config
    env: DistEnv
    guard: Guard  # watchdog marks, the preemption boundary, restarts
    state: RunState
    meters: Meters
    out_dir: Path  # profile tables, sleep times, the timeline


@dataclass
class Prepared:
    """What ``run.prepare`` built around the user's model and optimizer: the parts every step goes through.

    Example::

        parts = Prepared(apply_strategy(model, env, cfg.strategy), optimizer, build_instruments(ctx, strategy))
        stepper = Stepper(ctx, parts, feed)
    """

    strategy: Strategy
    optimizer: torch.optim.Optimizer | None
    instruments: Instruments
