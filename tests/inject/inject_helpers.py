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


def outside_load(cause: dict[str, Any]) -> bool:
    """A cause that is a neighbour's doing, named by its processes: an outside load, not the script's."""
    return cause["name"] == "external_load" or (
        cause["name"] == "cpu_contention" and (cause.get("who") or {}).get("whose") == "outside"
        and bool(cause["who"].get("outside")))


def false_claims(doc: dict[str, Any], expected_setup: frozenset[str] = frozenset()) -> list[str]:
    """What a doctor report on a clean script claims beyond what a clean run may report; empty when honest.

    A clean 2-rank job on a 2-core host may claim (as significant) only: ``communication`` (the exchange two
    ranks need), ``cpu_contention`` that names whose threads held the cores (the job's own, its exchange running
    on CPU threads beside its compute, or outside processes by pid) and ``external_load`` (a neighbour, named).
    Any other cause claimed, a claim larger than the loss beyond its noise, or a setup cause other than
    ``expected_setup`` (what the framework itself sets, such as the Hugging Face Trainer's default
    ``find_unused_parameters=True``) is a false alarm.
    """
    loss, noise = doc["scaling_loss_s"], doc["scaling_loss_noise_s"]
    bad = []
    for c in (c for c in doc["causes"] if c["significant"]):
        who = c.get("who") or {}
        named = outside_load(c) or (c["name"] == "cpu_contention" and who.get("whose") == "own"
                                    and (who.get("exchange_on_cpu") or who.get("oversubscribed"))
                                    and "the job's own" in c["evidence"])
        if c["name"] != "communication" and not named:
            bad.append(f"{c['name']} claimed: {c['evidence'][:200]}")
        if c["seconds_per_step"] > loss + noise:
            bad.append(f"{c['name']} {c['seconds_per_step']:.4f} s above the loss {loss:.4f} + noise {noise:.4f}")
    setup = (doc.get("injected") or {}).get("setup_causes") or []
    return bad + [f"setup cause {c['name']}" for c in setup if c["name"] not in expected_setup]
