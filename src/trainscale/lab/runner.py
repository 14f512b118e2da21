"""Run ``trainscale train`` as a subprocess and read its summary: the lab's only view of a job.

Every experiment of ``bench`` and ``doctor`` is a command a user could type (``RunSpec.command``),
so any number in a report can be reproduced by hand.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RunSpec", "RunFailed", "run_train", "LauncherOptions"]


class RunFailed(RuntimeError):
    """A training run ended with an error (or timed out); ``detail`` holds its last error lines."""

    def __init__(self, spec: "RunSpec", detail: str):
        self.spec, self.detail = spec, detail
        super().__init__(f"{spec.label} failed: {detail}")


@dataclass
class LauncherOptions:
    """Multi-node options handed to the launcher (``trainscale launch``, i.e. torchrun)."""

    nnodes: str = "1"
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None

    @property
    def multi_node(self) -> bool:
        return self.nnodes != "1" or bool(self.rdzv_endpoint or self.master_addr)

    def argv(self) -> list[str]:
        out = ["--nnodes", self.nnodes, "--node-rank", str(self.node_rank)]
        if self.master_addr:
            out += ["--master-addr", self.master_addr]
        if self.master_port:
            out += ["--master-port", str(self.master_port)]
        if self.rdzv_endpoint:
            out += ["--rdzv-endpoint", self.rdzv_endpoint]
        return out


@dataclass
class RunSpec:
    """One training run: processes per node, the user's train options plus the experiment's own."""

    nproc: int
    args: list[str]
    json_path: Path
    label: str = ""
    launcher: LauncherOptions = field(default_factory=LauncherOptions)

    def command(self) -> list[str]:
        """The exact command line run for this experiment."""
        train = ["train", *self.args, "--json", str(self.json_path), "--log.progress", "none"]
        if self.launcher.multi_node:
            return [sys.executable, "-m", "trainscale", "launch", "--nproc-per-node", str(self.nproc),
                    *self.launcher.argv(), "-m", "trainscale", *train]
        return [sys.executable, "-m", "trainscale", "train", "--nproc", str(self.nproc), *train[1:]]

    def shell(self) -> str:
        """The command as a user would type it."""
        cmd = self.command()
        return "trainscale " + " ".join(shlex.quote(c) for c in cmd[3:])


def _error_lines(text: str, keep: int = 6) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errs = [ln for ln in lines if "Error" in ln or "error" in ln or "failed" in ln]
    chosen = (errs or lines)[-keep:]
    return " | ".join(ln.strip() for ln in chosen) or "no output"


def run_train(spec: RunSpec, timeout: float) -> dict[str, Any]:
    """Run one training job; return its summary, or raise RunFailed with the job's own error."""
    spec.json_path.parent.mkdir(parents=True, exist_ok=True)
    spec.json_path.unlink(missing_ok=True)
    env = {**os.environ, "TRAINSCALE_TABLE_PRINTED": "1", "PYTHONUNBUFFERED": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)  # the lab is never itself a rank; each run launches its own
    # A session of its own: on a timeout the launcher and every rank it started end together.
    p = subprocess.Popen(spec.command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(p)
        raise RunFailed(spec, f"no result within {timeout:g}s (timed out; its processes were ended)") from None
    except BaseException:
        _kill_group(p)
        raise
    # The job's own output, kept beside its summary: the evidence behind a number or a failure.
    spec.json_path.with_suffix(".log").write_text(f"$ {spec.shell()}\n{out}\n{err}")
    if p.returncode != 0 or not spec.json_path.is_file():
        raise RunFailed(spec, _error_lines(err + "\n" + out) + f" (full output: {spec.json_path.with_suffix('.log')})")
    summary = json.loads(spec.json_path.read_text())
    summary["command"] = spec.shell()
    return summary


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.communicate()
