"""Helpers shared by the benchmarks: run trainscale as a user would and read its summary."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def train_summary(args: list[str], timeout: float = 600) -> dict[str, Any]:
    """Run ``trainscale train ARGS --json`` in a subprocess and return its summary."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "s.json"
        p = subprocess.run([sys.executable, "-m", "trainscale", "train", *args, "--json", str(out),
                            "--log.progress", "none"], capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise SystemExit(f"trainscale train failed ({p.returncode}):\n{p.stderr[-3000:]}")
        return json.loads(out.read_text())


def spread(values: list[float]) -> float:
    """Relative spread (max - min) / median of repeated measurements."""
    return (max(values) - min(values)) / statistics.median(values) if values else float("nan")


def emit(result: dict[str, Any]) -> None:
    """The benchmark's result: one JSON object on the last line of stdout."""
    print(json.dumps(result))


def launch_runs(nproc: int, cases: list[tuple[str, list[str]]], timeout: float = 1200) -> dict[str, dict[str, Any]]:
    """Run ``cases`` (name, trainscale train arguments) in order in one launched job of ``nproc`` processes.

    One process-group start-up for all (``_pipeline_job.py``); returns each case's summary by name.
    """
    here = Path(__file__).parent
    with tempfile.TemporaryDirectory() as d:
        jobs = [f"{name}=" + ",".join([*args, "--log.progress", "none"]) for name, args in cases]
        p = subprocess.run([sys.executable, "-m", "trainscale", "launch", "--nproc-per-node", str(nproc),
                            str(here / "_pipeline_job.py"), d, *jobs], capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise SystemExit(f"trainscale launch failed ({p.returncode}):\n{p.stderr[-3000:]}")
        return {name: json.loads((Path(d) / name / "run.json").read_text()) for name, _ in cases}


def launch_self(script: str, args: list[str], nproc: int = 2) -> dict[str, Any]:
    """Launch ``script ARGS --worker-out FILE`` as a job of ``nproc`` processes; return what rank 0 wrote to FILE."""
    from trainscale.distributed import LaunchSpec, launch

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        launch(LaunchSpec(script=script, nproc_per_node=nproc, print_table=False,
                          args=[*args, "--worker-out", str(out)]))
        return json.loads(out.read_text())
