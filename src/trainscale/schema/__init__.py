"""The run summary's contract: its JSON Schema (``summary.schema.json``), the names code addresses in it, and its
reader and writer. The run and the injected agent write summaries here; the lab, the planner and the benchmarks read them.

Example::

    from trainscale.schema import read_summary
    summary = read_summary("run.json")  # unmeasured numbers (null) come back as NaN
"""

from .contract import ACCOUNTED, PHASE_FLAGS, PHASES, SCHEMA_VERSION, SPANS, STEP_ROW, Col, cell
from .reader import read_summary, summary_schema
from .writer import strict_json, write_summary

__all__ = ["PHASE_FLAGS", "PHASES", "SPANS", "STEP_ROW", "Col", "ACCOUNTED", "cell", "SCHEMA_VERSION", "read_summary",
           "summary_schema", "write_summary", "strict_json"]
