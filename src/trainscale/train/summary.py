"""The run summary: one JSON object that the lab, the doctor, the benchmarks and the tests read.

This module prints it; its schema, reader and writer live in ``trainscale.schema`` (re-exported here).
"""

from __future__ import annotations

import math
import sys
from typing import Any

from ..reporting.stats import median_interdecile
from ..schema import SCHEMA_VERSION, read_summary, strict_json, summary_schema, write_summary  # with the schema

__all__ = ["write_summary", "read_summary", "print_summary", "median_interdecile", "strict_json", "summary_schema",
           "human", "SCHEMA_VERSION"]


def human(value: Any, unit: str = "") -> str:
    """A number as people read it: 15,260 samples/s, 3.49 ms, 42.1%; null/NaN as a dash."""
    if value is None or isinstance(value, float) and not math.isfinite(value):
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if unit == "s":  # durations: the unit that keeps 3 significant digits readable
        for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
            if abs(value) >= scale or name == "us":
                return f"{value / scale:,.3g} {name}" if abs(value / scale) < 1000 else f"{value / scale:,.0f} {name}"
    if unit == "%":
        return f"{value:.1%}"
    if unit == "B":
        for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= scale:
                return f"{value / scale:,.2f} {name}"
        return f"{value:,.0f} B"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}" + (f" {unit}" if unit else "")
    return f"{value:.4g}" + (f" {unit}" if unit else "")


# How the terminal table shows each field (unit for ``human``); the JSON keeps full precision.
_UNITS = {"samples_per_s": "samples/s", "data_samples_per_s": "samples/s", "step_time_s": "s", "comm_wait_s": "s",
          "wall_s": "s", "step_time_spread": "%", "data_wait_frac": "%", "eval_accuracy": "%",
          "comm_bytes_per_step": "B", "optim_state_bytes": "B", "mfu": "%"}


def _fmt(key: str, v: Any) -> str:
    return human(v, _UNITS.get(key, ""))


def print_summary(summary: dict[str, Any]) -> None:
    """The table shown at the end of a run."""
    from rich.console import Console  # here, not at the top: every rank imports this module, one prints
    from rich.table import Table

    table = Table(title="Run summary", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("model", "world_size", "backend", "global_batch", "steps", "samples_per_s", "step_time_s",
                "step_time_spread", "data_wait_frac", "data_samples_per_s", "loss_first", "loss_last", "eval_loss", "eval_accuracy",
                "flops_per_step", "mfu", "peak_flops_source",
                "allreduce_calls_per_step", "bucket_mb", "comm_bytes_per_step", "comm_wait_s", "optim_state_bytes",
                "overlap", "amp", "wall_s"):
        if key in summary:
            table.add_row(key, _fmt(key, summary[key]))
    pipe = summary.get("pipeline")
    if pipe:
        table.add_row("pipeline", f"{pipe['stages']} stages x {pipe['replicas']} replicas, {pipe['schedule']}, "
                                  f"{pipe['microbatches']} micro-batches")
        table.add_row("stage boundaries", ", ".join(pipe["boundaries"]))
        table.add_row("stage time", " | ".join(human(t, "s") for t in pipe["stage_time_s"]))
        table.add_row("stage imbalance", f"{human(pipe['imbalance'])} (slowest / mean)")
        table.add_row("bubble measured / theory", f"{human(pipe['bubble_measured'], '%')} / "
                                                  f"{human(pipe['bubble_theory'], '%')}")
    Console(file=sys.stdout).print(table)
