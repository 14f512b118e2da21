"""The names the run summary shares between the run that writes it and the lab that reads it.

The phases ``ablate.phases`` may cycle through, the spans of one step in ``timeline.json``, and the columns of a
phase's per-step rows (``phases.<name>.rank_steps[rank][i]``), each with its index as a named constant, so a
reader writes ``row[Col.COMM_WAIT]``, never ``row[7]``. ``summary.schema.json`` beside this module is the whole
schema; this module is the part of it that code addresses by name.

Example::

    from trainscale.schema import Col, cell
    exposed = cell(row, Col.COMM_WAIT)  # NaN where the run did not measure it
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import IntEnum

__all__ = ["PHASE_FLAGS", "PHASES", "SPANS", "STEP_ROW", "Col", "ACCOUNTED", "cell", "SCHEMA_VERSION"]

SCHEMA_VERSION = 2  # bumped only when a field changes meaning; fields are added, never removed or renamed

# The one table of ablation phases (what ablate.phases may cycle through): name -> (no_comm, no_data).
# Cumulative, like the doctor's separate experiments: no_comm also keeps one batch on the device.
PHASE_FLAGS: dict[str, tuple[bool, bool]] = {"base": (False, False), "no_data": (False, True), "no_comm": (True, True)}
PHASES = tuple(PHASE_FLAGS)
# The spans of one step in timeline.json, in the order they happen (the timeline and the doctor's plots share them).
SPANS = ("data wait", "host work", "forward+backward", "waiting for slowest rank", "exposed communication", "optimizer")


class Col(IntEnum):
    """The columns of a phase's per-step rows, in seconds (``STEP_ROW`` names them as the summary does).

    RUNQ_MAIN: the training thread's time runnable but not running (Linux schedstat); RUNQ_CRIT: of the threads
    a step waits for (the main thread and the backend's: collectives, intra-op), not the loader's, whose waits show
    as data wait; ARRIVAL: when the rank's last gradient was ready, on a clock common to all ranks. Older summaries
    have the first four only (``ACCOUNTED`` on are the per-rank accounting); a column a run did not measure is NaN.
    """

    CYCLE = 0
    STEP = 1
    COMPUTE = 2
    DATA_WAIT = 3
    RUNQ_MAIN = 4
    RUNQ_CRIT = 5
    CPU_ALL = 6
    COMM_WAIT = 7
    ARRIVAL = 8


ACCOUNTED = Col.RUNQ_MAIN  # the first column of the per-rank accounting (absent from older summaries)
STEP_ROW = ("cycle", "step_s", "compute_s", "data_wait_s", "runq_main_s", "runq_crit_s", "cpu_all_s", "comm_wait_s",
            "arrival_s")


def cell(row: Sequence[float | None], col: Col) -> float:
    """``row[col]`` as a float; NaN where the row is too short (an older summary) or the value was not measured."""
    v = row[col] if col < len(row) else None
    return float("nan") if v is None or not math.isfinite(v) else float(v)
