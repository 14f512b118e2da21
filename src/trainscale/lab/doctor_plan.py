"""The doctor's experiment plan, as pure decisions over the results so far (the runner only executes them).

First level: repeats of one phased run at 1 and at N processes (base, no_data, no_comm paired inside each run),
at least two, up to ``--repeat`` while the budget lasts; then sequential repeats, up to twice that, while a cause
is only likely or undecided and the next repeat fits the budget. Second level, when a compute-side cause is clear
(and not ``--quick``): the sleep test, an operator profile at 1 and N, and thread-count trials.

Example::

    plan = DoctorPlan(n=2, repeat=3, budget=600, quick=False)
    plan.first_repeats_done(r=2, elapsed=80.0)          # False: a third repeat fits the budget
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DoctorPlan", "COMPUTE_SIDE", "thread_candidates"]

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
