"""The run summary's contract: its JSON Schema (``summary.schema.json``), the names code addresses in it, and its
reader. The run writes summaries (``train.summary``); the lab, the planner and the benchmarks read them here.

Example::

    from trainscale.schema import read_summary
    summary = read_summary("run.json")  # unmeasured numbers (null) come back as NaN
"""

from .contract import ACCOUNTED, PHASE_FLAGS, PHASES, SCHEMA_VERSION, SPANS, STEP_ROW, Col, cell
from .reader import read_summary, summary_schema

__all__ = ["PHASE_FLAGS", "PHASES", "SPANS", "STEP_ROW", "Col", "ACCOUNTED", "cell", "SCHEMA_VERSION", "read_summary",
           "summary_schema"]
