"""The doctor on conditions its matrix was not built on: does it name what a user would have to change?

Cases (each run ``--repeats`` times, one doctor run each):

* ``neighbour``: a busy loop pinned to core 1 (``taskset -c 1 sh -c 'while :; do :; done'``) beside the default
  job (``trainscale doctor --nproc 2``). Hit: the first clear cause is ``cpu_contention`` or ``external_load``
  and it names the neighbour's pid; never ``communication``.
* ``membw``: a numpy loop copying 64 MB arrays, pinned to core 1, beside resnet18 (width 8, synthetic 32x32).
  Hit: the first clear cause is compute-side or CPU contention, never ``communication`` or ``input``.
* ``collate``: a user's script whose collate function costs 20 ms a batch, no workers
  (``benchmarks/campaigns/_slow_collate_job.py``). Hit: ``bottleneck.name`` is ``input`` with ``share`` >= 0.5 and the
  advice says how to feed it faster.

    PYTHONPATH=src python benchmarks/campaigns/doctor_cases.py [--cases neighbour,membw,collate] [--repeats 3] [--keep DIR]

Last stdout line: one JSON object with the hits per case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainscale.jobs import communicate_or_kill
from trainscale.signals import interrupt_on

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
MEMBW = ("import numpy as np\nsrc = np.ones(8 << 20); dst = np.empty_like(src)\n"
         "while True:\n    np.copyto(dst, src); np.copyto(src, dst)\n")  # 64 MB arrays of float64
CASES = {
    "neighbour": (["taskset", "-c", "1", "sh", "-c", "while :; do :; done"], []),
    "membw": (["taskset", "-c", "1", sys.executable, "-c", MEMBW],
              ["--model", "resnet18", "--model.width", "8", "--data", "synthetic", "--data.image_size", "32"]),
    "collate": (None, ["--", sys.executable, str(REPO / "benchmarks" / "campaigns" / "_slow_collate_job.py")]),
}
COMPUTE_SIDE = ("compute_interference", "straggler", "slow_operator", "framework_overhead", "threads",
                "cpu_contention", "external_load", "sync_wait")


def first_clear(doc: dict) -> dict | None:
    return next((c for c in doc.get("causes") or [] if c["verdict"] == "clear"), None)


def judge(case: str, doc: dict, neighbour_pid: int | None) -> bool:
    """Whether the doctor's answer is the one the case needs (see the module docstring)."""
    top = first_clear(doc)
    if case == "neighbour":
        return bool(top and top["name"] in ("cpu_contention", "external_load") and str(neighbour_pid) in
                    (top["evidence"] + top.get("suggestion", "")))
    if case == "membw":
        return bool(top and top["name"] in COMPUTE_SIDE)
    b = doc.get("bottleneck") or {}
    return b.get("name") == "input" and (b.get("share") or 0) >= 0.5 and "workers" in b.get("advice", "")


def one(case: str, out: Path, timeout: float) -> tuple[dict, int | None]:
    load_cmd, job = CASES[case]
    load = subprocess.Popen(load_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True) if load_cmd else None
    try:
        time.sleep(1.0 if load else 0.0)  # the neighbour is running before the doctor looks
        cmd = [sys.executable, "-m", "trainscale", "doctor", "--nproc", "2", "--out", str(out), *job]
        communicate_or_kill(cmd, ENV, timeout)
        # taskset execs its command, so the process started is the one that uses the core.
        return json.loads((out / "doctor.json").read_text()), (load.pid if load else None)
    finally:
        if load is not None:
            os.killpg(load.pid, signal.SIGKILL)
            load.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1500)
    ap.add_argument("--keep", type=Path, help="keep each doctor's folder here")
    a = ap.parse_args()
    if not shutil.which("taskset"):
        sys.exit("doctor_cases: needs taskset (util-linux) to pin the neighbour to one core")
    folder = contextlib.nullcontext(str(a.keep)) if a.keep else tempfile.TemporaryDirectory()
    cells = []
    with interrupt_on(signal.SIGTERM), folder as d:
        for case in a.cases.split(","):
            hits, rows = 0, []
            for r in range(a.repeats):
                t0 = time.monotonic()
                doc, pid = one(case, Path(d) / f"{case}_{r}", a.timeout)
                ok = judge(case, doc, pid)
                hits += ok
                top = [(c["name"], c["verdict"], round(c["seconds_per_step"] * 1e3, 2)) for c in doc["causes"][:3]]
                b = doc.get("bottleneck") or {}
                rows.append({"hit": ok, "top": top, "bottleneck": [b.get("name"), b.get("share")],
                             "efficiency": doc.get("efficiency"), "neighbour_pid": pid,
                             "seconds": round(time.monotonic() - t0, 1), "invariants": doc.get("invariants")})
                print(f"{case:9s} run {r + 1}: {'hit ' if ok else 'MISS'} top {top} bottleneck {rows[-1]['bottleneck']}"
                      f" pid {pid} ({rows[-1]['seconds']} s)", flush=True)
            cells.append({"case": case, "hits": hits, "runs": a.repeats, "results": rows})
    print(json.dumps({"cases": {c["case"]: f"{c['hits']}/{c['runs']}" for c in cells}, "cells": cells}))


if __name__ == "__main__":
    main()
