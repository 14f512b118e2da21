"""A rank's CPU per step at P processes, measured by thread class, against what the calibration accounts for.

Calibrates the job with ``--interference`` at the given process counts (the 1-process bare step, DDP's reducer,
the probe's burst fit of Gloo's CPU, the skeleton's own CPU per step, the job at P with no exchange), then runs
the job at each P and prints one JSON line per P: the ranks' mean CPU seconds per step, split by thread class
(``accounting``: main, backend, loader, ...), beside each accounted quantity. Used by
benchmarks/results/2026-11-28-plan-reducer.md::

    PYTHONPATH=src python benchmarks/campaigns/plan_cpu_gap.py 2,4
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from trainscale.costs.step import make_buckets
from trainscale.jobs import RunSpec, run_train
from trainscale.sim.calibrate import calibrate

JOB = ["--model", "mlp", "--data", "digits", "--steps", "800"]


def _by_thread(summary: dict, world: int) -> dict[str, float]:
    """The ranks' mean CPU milliseconds per step per thread class."""
    out: dict[str, float] = {}
    for r in summary["accounting"]["ranks"]:
        for k, v in r["cpu_s"].items():
            out[k] = out.get(k, 0.0) + v * 1e3 / world
    return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nproc", help="process counts, e.g. 2,4")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="the job's bucket size (DDP's default: 25)")
    a = ap.parse_args()
    procs = [int(x) for x in a.nproc.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="plan-cpu-gap-"))
    cal = calibrate(JOB, procs, tmp / "cal.json", say=lambda m: print(m, file=sys.stderr), with_base=False,
                    interference=True)
    bare = next(iter(cal.single.values()))["cpu_s"]
    reducer = next(iter(cal.reducer.values()), {}).get("cpu_s", 0.0)
    ms = 1e3
    for p in procs:
        s = run_train(RunSpec(p, [*JOB, "--job.threads", "1"], tmp / f"run{p}.json", f"{p} processes"), 600)
        sk = cal.replay[str(p)]
        burst = sum(cal.cluster(p).comm_cpu_s(b, p) for b in make_buckets(cal.tensor_bytes, a.bucket_mb * 2 ** 20))
        measured = sum(s["rank_cpu_s"]) / p
        print(json.dumps({"P": p, "measured_ms": round(measured * ms, 3), "by_thread_ms": _by_thread(s, p),
                          "bare_ms": round(bare * ms, 3), "nocomm_at_p_ms": round(cal.inflation[str(p)]["cpu_s"] * ms, 3),
                          "reducer_ms": round(reducer * ms, 3), "gloo_burst_fit_ms": round(burst * ms, 3),
                          "accounted_ms": round((bare + reducer + burst) * ms, 3),
                          "skeleton_cpu_ms": round(sum(sk["rank_cpu_s"]) / p * ms, 3),
                          "skeleton_beyond_spin_ms": round(sk["exchange_cpu_s"] * ms, 3)}), flush=True)


if __name__ == "__main__":
    main()
