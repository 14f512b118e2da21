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
    overheads: list[float] = field(default_factory=list)  # per mini-batch: round trip minus injected delay
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
    # Where a mini-batch's and an update's time goes: phase -> [seconds summed, count] (see add_time).
    phases: dict[str, list[float]] = field(default_factory=dict)

    def add_time(self, phase: str, seconds: float) -> None:
        """Count ``seconds`` for ``phase``.

        Phases: learner_wait (launch to the learner's method starting: queueing and fetching its arguments
        from the object store), learner_load (parameters into the replica), learner_compute (forward and
        backward), learner_return (method end to the coordinator noticing: serialising and storing the
        results, the reply), coordinator (handling one event: decide, submit), shard_wait (apply submitted
        to started: queueing and fetching the gradients), shard_apply (the optimizer step on the slice).
        """
        acc = self.phases.setdefault(phase, [0.0, 0])
        acc[0] += seconds
        acc[1] += 1

    def phase_means_ms(self) -> dict[str, float]:
        """Mean milliseconds of each phase."""
        return {k: round(1e3 * total / n, 4) for k, (total, n) in self.phases.items() if n}

    def now(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.t0

    @property
    def restarts(self) -> int:
        """Learner and shard restarts seen in this run."""
        return self.learner_restarts + self.shard_restarts
