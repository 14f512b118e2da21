"""What a parameter-server run measured, filled by the coordinator or the Downpour driver."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunRecord", "PsError"]


class PsError(RuntimeError):
    """The job cannot continue (a wait timed out, every learner is gone); the message says why."""


@dataclass
class RunRecord:
    """Times are seconds since ``t0`` (``time.perf_counter``)."""

    t0: float = field(default_factory=time.perf_counter)
    wall_s: float = 0.0
    updates: int = 0
    update_times: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # mean training loss of each update's gradients
    staleness: list[int] = field(default_factory=list)  # one entry per applied gradient
    timeline: list[dict[str, Any]] = field(default_factory=list)
    bytes_pushed: int = 0
    bytes_pulled: int = 0
    learner_restarts: int = 0
    shard_restarts: int = 0
    updates_lost: int = 0
    cancelled: int = 0
    errors: int = 0
    eval_points: list[tuple[int, float, list]] = field(default_factory=list)  # (update, t, param refs)
    # Downpour counts staleness on the shards and losses on the learners: (sum, count, max) and first/last.
    stale_stats: tuple[int, int, int] | None = None
    loss_first: float | None = None
    loss_last: float | None = None

    def now(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.t0

    @property
    def restarts(self) -> int:
        """Learner and shard restarts seen in this run."""
        return self.learner_restarts + self.shard_restarts
