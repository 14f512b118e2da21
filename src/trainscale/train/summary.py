"""The run summary: one JSON object that the lab, the doctor, the benchmarks and the tests read."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .checkpoint import atomic_write_bytes

__all__ = ["write_summary", "print_summary", "median_spread"]


def median_spread(values: list[float]) -> tuple[float, float]:
    """Median and relative spread ((p90 - p10) / median) of a list of timings."""
    if not values:
        return float("nan"), float("nan")
    med = statistics.median(values)
    s = sorted(values)
    lo, hi = s[int(0.1 * (len(s) - 1))], s[int(0.9 * (len(s) - 1))]
    return med, ((hi - lo) / med if med else float("nan"))


def write_summary(path: str | Path, summary: dict[str, Any]) -> None:
    """Write the summary atomically (never a half-written JSON)."""
    atomic_write_bytes(path, lambda f: f.write((json.dumps(summary, indent=2, default=str) + "\n").encode()))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_summary(summary: dict[str, Any]) -> None:
    """The table shown at the end of a run."""
    table = Table(title="Run summary", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("model", "world_size", "backend", "global_batch", "steps", "samples_per_s", "step_time_s",
                "step_time_spread", "data_wait_frac", "data_samples_per_s", "loss_first", "loss_last", "eval_loss", "eval_accuracy",
                "allreduce_calls_per_step", "bucket_mb", "comm_bytes_per_step", "comm_wait_s", "optim_state_bytes",
                "overlap", "amp", "wall_s"):
        if key in summary:
            table.add_row(key, _fmt(summary[key]))
    Console(file=sys.stdout).print(table)
