"""Paired ablations inside one run (``ablate.phases``): which ablation each step runs, and per-phase timings.

Separate runs of the same job differ by more than their ablation: start-up, where the scheduler puts the
ranks, how fast the collectives happen to be that minute (on a shared 2-core VM, two runs of the same job
can differ by 2x). Cycling short blocks of phases inside one run makes every phase see the same conditions,
so their differences are paired measurements, and one run replaces one run per phase.

The phases are cumulative, like the doctor's separate experiments: ``no_data`` keeps one batch on the device,
``no_comm`` also drops the gradient exchange.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...config import PHASE_FLAGS, Config
from ..summary import median_interdecile

__all__ = ["PhasePlan", "StepMode", "local_phase_stats", "merge_phase_stats"]

@dataclass(frozen=True)
class StepMode:
    """What one optimizer step leaves out (a controlled experiment) and whether its time counts for its phase."""

    no_comm: bool = False
    no_data: bool = False
    phase: str | None = None
    timed: bool = False
    cycle: int = -1  # which pass through the phases (the lab resamples whole cycles: a paired, blocked design)

    @classmethod
    def of_phase(cls, phase: str, timed: bool, cycle: int) -> StepMode:
        no_comm, no_data = PHASE_FLAGS[phase]
        return cls(no_comm, no_data, phase, timed, cycle)


@dataclass
class PhasePlan:
    """Blocks of ``block`` steps cycling through ``names``; the first ``settle`` steps of a block are not timed."""

    names: list[str]
    block: int
    settle: int

    @classmethod
    def from_config(cls, cfg: Config) -> PhasePlan | None:
        names = cfg.ablate.phase_list()
        if not names:
            return None
        # After a switch the pipeline's buffered batches (prefetch queue, workers' queues) make the first base
        # steps free, and refilling them slows the first no_data steps: those steps are not timed.
        buffered = 1 + cfg.data.prefetch + 2 * cfg.data.workers
        return cls(names, cfg.ablate.phase_steps, min(buffered, cfg.ablate.phase_steps // 2))

    def at(self, i: int) -> tuple[str, bool, int]:
        """(phase, timed, cycle) of the i-th step after warm-up."""
        return (self.names[(i // self.block) % len(self.names)], i % self.block >= self.settle,
                i // (self.block * len(self.names)))


def local_phase_stats(marks: list[str | None], step_times: list[float], waits: list[float],
                      compute: list[float], cycles: list[int], extra: list[list[float]] | None = None
                      ) -> dict[str, tuple[Any, ...]]:
    """This rank's per phase: (compute median, compute spread, step median, step spread, steps, step s, wait s,
    per-step [cycle, step s, compute s, wait s, *extra] rows); ``extra``: the accounting's columns per step."""
    out = {}
    for name in dict.fromkeys(m for m in marks if m):
        idx = [i for i, m in enumerate(marks) if m == name]
        steps = [step_times[i] for i in idx]
        med, spread = median_interdecile(steps)
        comp = median_interdecile([compute[i] for i in idx if i < len(compute)])
        rows = [[cycles[i], step_times[i], compute[i] if i < len(compute) else float("nan"), waits[i],
                 *(extra[i] if extra else ())] for i in idx]
        out[name] = (*comp, med, spread, len(idx), sum(steps), sum(waits[i] for i in idx), rows)
    return out


def merge_phase_stats(per_rank: list[dict[str, tuple]], global_batch: int, origin: float = 0.0
                      ) -> dict[str, dict[str, Any]]:
    """Per-phase fields shaped like the run summary's own (rank 0's median and spread, per-rank lists).

    ``rank_steps`` keeps every rank's timed steps as rows, so the lab can resample whole cycles (its bootstrap)
    instead of trusting a normal-theory spread: ``[cycle, step s, compute s, data wait s, runq_main s,
    runq_crit s, cpu_all s, comm_wait s, arrival s]`` (``config.STEP_ROW``; columns 4-8 are the per-rank accounting,
    NaN without it). Arrivals come on rank 0's clock; ``origin`` (rank 0's loop start on it) is subtracted.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, (_, _, med, spread, n, total, wait, _rows) in per_rank[0].items():
        out[name] = {"step_time_s": med, "step_time_spread": spread, "measured_steps": n,
                     "samples_per_s": n * global_batch / total if total else float("nan"),
                     "data_wait_frac": wait / total if total else float("nan"),
                     "rank_compute_s": [r[name][0] for r in per_rank],
                     "rank_compute_spread": [r[name][1] for r in per_rank],
                     "rank_step_time_s": [r[name][2] for r in per_rank],
                     "rank_steps": [[_shifted(row, origin) for row in r[name][7]] for r in per_rank]}
    return out


def _shifted(row: list[float], origin: float) -> list[float]:
    """``row`` with its arrival (column 8) counted from ``origin``."""
    return [*row[:8], row[8] - origin, *row[9:]] if len(row) > 8 else row
