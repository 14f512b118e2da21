"""Shared test helpers: run the CLI exactly as a user does, in a subprocess with a timeout.

A plain module (not conftest.py) so that no sub-folder's conftest can shadow it; pytest puts
tests/ on sys.path (pyproject: pythonpath).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def run_cli(args: list[str], timeout: float = 120, env: dict[str, str] | None = None, cwd: Path | None = None) -> Result:
    """Run ``trainscale ARGS`` as a subprocess; a hang fails the test instead of stalling the suite."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("RANK", None)  # never inherit a launcher's identity
    p = subprocess.run([sys.executable, "-m", "trainscale", *args], capture_output=True, text=True, timeout=timeout,
                       env=full_env, cwd=cwd or REPO)
    return Result(p.returncode, p.stdout, p.stderr)


def still_running(procs: Any) -> list[Any]:
    """The ``psutil.Process`` objects of ``procs`` that are still alive (zombies count as gone)."""
    import psutil

    left = []
    for q in procs:
        try:
            if q.is_running() and q.status() != psutil.STATUS_ZOMBIE:
                left.append(q)
        except psutil.Error:
            pass
    return left


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON file; a run summary is parsed strictly and validated against the shipped schema first."""
    from summaries import check_summary_file
    check_summary_file(Path(path))
    return json.loads(Path(path).read_text())


# Tiny and fast defaults for training runs in tests.
FAST = ["--log.progress", "lines", "--log.every", "5", "--log.skip_first", "1"]
