"""The bench's and the doctor's experiment plans, as pure decisions over the results so far (their runners in
``bench.py`` and ``doctor.py`` only execute them).

The bench's sweep measures each world size in ascending order, ``repeat`` runs each, and stops at the first failed
run (the points measured before it are kept). Weak scaling keeps the user's per-device batch; strong scaling keeps
the global batch of the base point, so every world size must divide it.

The doctor's first level: repeats of one phased run at 1 and at N processes (base, no_data, no_comm paired inside
each run), at least two, up to ``--repeat`` while the budget lasts; then sequential repeats, up to twice that, while
a cause is only likely or undecided and the next repeat fits the budget. Second level, when a compute-side cause is
clear (and not ``--quick``): the sleep test, an operator profile at 1 and N, and thread-count trials.

Example::

    plan = BenchPlan(nprocs=(1, 2, 4), repeat=3, scaling="strong", batch_size=64)
    plan.run_args(["--model", "mlp"], 4)   # [..., "--data.batch_size", "16", "--timeline"]
    plan = DoctorPlan(n=2, repeat=3, budget=600, quick=False)
    plan.first_repeats_done(r=2, elapsed=80.0)          # False: a third repeat fits the budget
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import ConfigError

__all__ = ["BenchPlan", "DoctorPlan", "COMPUTE_SIDE", "thread_candidates"]


@dataclass(frozen=True)
class BenchPlan:
    """Process counts per node to sweep, runs per point, weak or strong scaling; checked when built."""

    nprocs: tuple[int, ...]
    repeat: int
    scaling: str = "weak"
    nnodes: int = 1
    batch_size: int = 0  # the user's per-device batch, kept at the base point

    def __post_init__(self) -> None:
        if self.scaling == "strong":
            bad = [n for n in self.nprocs if self.global_batch % self.world(n)]
            if bad:
                raise ConfigError("--batch-size", self.batch_size,
                                  f"strong scaling keeps the global batch {self.global_batch}; it must divide by "
                                  f"every world size (not by {self.world(bad[0])})")

    @property
    def global_batch(self) -> int:
        """Samples per step at the base point, which strong scaling keeps at every world size."""
        return self.batch_size * self.world(self.nprocs[0])

    @property
    def total_runs(self) -> int:
        """Runs the whole sweep takes when none fails."""
        return len(self.nprocs) * self.repeat

    def world(self, nproc: int) -> int:
        """World size of a point with ``nproc`` processes on each node."""
        return nproc * self.nnodes

    def run_args(self, user: list[str], nproc: int) -> list[str]:
        """The train options of a run at ``nproc`` per node: the user's, the strong-scaling batch, a timeline."""
        batch = [] if self.scaling == "weak" else [
            "--data.batch_size", str(self.global_batch // self.world(nproc))]
        # --timeline costs two clock reads a step; its trace is the report's timeline picture.
        return [*user, *batch, "--timeline"]


# Causes that say compute is slower at N; the second-level experiments tell which part of compute.
COMPUTE_SIDE = ("compute_interference", "straggler", "external_load", "cpu_contention")


@dataclass(frozen=True)
class DoctorPlan:
    """When to stop repeating and whether to go a level deeper; budget and elapsed in seconds."""

    n: int
    repeat: int
    budget: float
    quick: bool

    def first_repeats_done(self, r: int, elapsed: float) -> bool:
        """After ``r`` repeats: at least two, then up to ``repeat`` while the budget lasts."""
        return r >= max(2, self.repeat) or (r >= 2 and elapsed >= self.budget)

    def repeat_again(self, result: dict[str, Any], r: int, elapsed: float) -> bool:
        """One more repeat: a cause is still likely or undecided, and another repeat fits in the budget."""
        open_cause = any(c["verdict"] in ("undecided", "likely") for c in result["causes"])
        return open_cause and r < 2 * max(2, self.repeat) and elapsed + elapsed / max(1, r) < self.budget

    def go_deeper(self, result: dict[str, Any]) -> bool:
        """Run the sleep test, profiles and thread trials: a compute-side cause is clear."""
        return not self.quick and any(c["significant"] for c in result["causes"] if c["name"] in COMPUTE_SIDE)


def thread_candidates(current: int, n: int, cores: int) -> list[int]:
    """Up to two intra-op thread counts to try at N processes besides ``current``: 1, cores / N, all cores."""
    return sorted({t for t in (1, max(1, cores // n), cores) if t != current})[:2]
