"""The doctor's hit rate: planted causes x background conditions, each cell repeated.

Planted causes (on the tests' small job): slow input (a shared slow disk), tiny buckets, a slowed rank, and a
clean job. Conditions: quiet; a CPU-bound process beside the job (``nice -n 10`` busy loop); a second copy of
the same job running at the same time. A cell is a hit when the planted cause is named first with verdict
``clear`` (for the clean job: no internal cause ``clear``; an ``external_load`` cause is allowed under load).
Each doctor run is ``trainscale doctor --nproc 2 --repeat 2 --quick``. Last stdout line: one JSON object.

    PYTHONPATH=src python benchmarks/doctor_matrix.py [--repeats 3] [--causes input,buckets,straggler,clean]
        [--conditions quiet,hog,twin]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = ["--data", "synthetic", "--data.image_size", "8", "--data.channels", "1", "--data.train_size", "512",
       "--data.eval_size", "16", "--job.threads", "1", "--log.skip_first", "3"]
PLANTED = {
    "input": (["--data.sample_delay_ms", "1.5", "--batch-size", "16"], "input"),
    "buckets": (["--strategy.bucket_mb", "0", "--model.depth", "16", "--model.width", "64"], "communication"),
    "straggler": (["--job.slow_rank", "1", "--job.slow_factor", "5", "--model.width", "256", "--batch-size", "64"],
                  "straggler"),
    "clean": ([], None),
}
INTERNAL = ("input", "communication", "straggler", "slow_operator", "compute_interference", "framework_overhead")


def doctor(args: list[str], out: Path, timeout: float = 900) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, "-m", "trainscale", "doctor", "--nproc", "2", "--repeat", "2", "--quick",
                    "--out", str(out), *JOB, *args], env=env, timeout=timeout, capture_output=True, check=False)
    return json.loads((out / "doctor.json").read_text())


def hit(doc: dict, want: str | None) -> bool:
    causes = doc.get("causes") or []
    if doc.get("error") or not causes:
        return False
    if want is None:
        return not any(c["name"] in INTERNAL and c["verdict"] == "clear" for c in causes)
    return causes[0]["name"] == want and causes[0]["verdict"] == "clear"


def background(condition: str, planted: list[str], tmp: Path) -> subprocess.Popen | None:
    if condition == "hog":
        return subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", "while True: pass"])
    if condition == "twin":  # the same job, run by a second doctor at the same time
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        return subprocess.Popen([sys.executable, "-m", "trainscale", "doctor", "--nproc", "2", "--repeat", "4",
                                 "--quick", "--out", str(tmp / "twin"), *JOB, *planted], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--causes", default=",".join(PLANTED))
    p.add_argument("--conditions", default="quiet,hog,twin")
    a = p.parse_args()
    cells = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for cond in a.conditions.split(","):
            for cause in a.causes.split(","):
                args, want = PLANTED[cause]
                results = []
                for r in range(a.repeats):
                    bg = background(cond, args, tmp)
                    try:
                        doc = doctor(args, tmp / f"{cond}_{cause}_{r}")
                    finally:
                        if bg is not None:
                            bg.kill()
                            bg.wait()
                    top = [(c["name"], c["verdict"], round(c["seconds_per_step"] * 1e3, 3)) for c in doc["causes"][:3]]
                    results.append({"hit": hit(doc, want), "top": top})
                    print(f"{cond:5s} {cause:9s} run {r + 1}: {'hit ' if results[-1]['hit'] else 'MISS'} {top}",
                          flush=True)
                cells.append({"condition": cond, "cause": cause, "hits": sum(x["hit"] for x in results),
                              "runs": len(results), "results": results})
    total = sum(c["hits"] for c in cells), sum(c["runs"] for c in cells)
    print(json.dumps({"hit_rate": total[0] / total[1], "hits": total[0], "runs": total[1], "cells": cells}))


if __name__ == "__main__":
    main()
