"""Running the unmodified scripts of ``tests/inject/scripts`` as a user does, and as trainscale's lab does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainscale.jobs import RunSpec, run_train

SCRIPTS = Path(__file__).resolve().parent / "scripts"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


def torchrun(script: str, args: list[str], nproc: int = 2, timeout: float = 120,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The script under plain torchrun, uninstrumented (``OMP_NUM_THREADS=1``, a free port)."""
    full = {**os.environ, **OFFLINE, "OMP_NUM_THREADS": "1", **(env or {})}
    for k in ("RANK", "TRAINSCALE_INJECT", "TRAINSCALE_INJECT_PID", "TRAINSCALE_ARGS", "TRAINSCALE_JSON"):
        full.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           str(SCRIPTS / script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full)


def injected(script: str, args: list[str], tmp: Path, nproc: int = 2, switches: list[str] | None = None,
             timeout: float = 150) -> dict[str, Any]:
    """One instrumented run, launched as the lab launches it; its run summary (``RunFailed`` if it has none)."""
    spec = RunSpec(nproc, ["--job.threads", "1", *(switches or [])], tmp / f"{Path(script).stem}_n{nproc}.json",
                   f"{script} at {nproc}", script=[str(SCRIPTS / script), *args])
    assert spec.injected
    saved = {k: os.environ.get(k) for k in OFFLINE}
    os.environ.update(OFFLINE)
    try:
        return run_train(spec, timeout)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
