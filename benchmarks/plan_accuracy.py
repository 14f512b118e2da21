"""Accuracy of ``trainscale plan`` on this machine: forecast vs measured median step time at 2, 3, 4 processes.

For each job: calibrate (1 process + the all-reduce probe), forecast, then measure ``trainscale train --nproc P``
in the same run, alternating processes counts, and report the relative error of each case.
Output contract: the last stdout line is one JSON object ({"cases": [...], "mean_abs_error": ...}).

    PYTHONPATH=src python benchmarks/plan_accuracy.py [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from trainscale.lab.runner import RunSpec, run_train
from trainscale.lab.stats import job_step_time
from trainscale.sim.calibrate import calibrate
from trainscale.sim.forecast import Strategy, forecast

JOBS = {
    "mlp-digits": ["--model", "mlp", "--data", "digits", "--steps", "60"],
    "resnet18w8-synthetic": ["--model", "resnet18", "--model.width", "8", "--data", "synthetic", "--steps", "25"],
    "resnet50w4-bucket0": ["--model", "resnet50", "--model.width", "4", "--data", "synthetic", "--steps", "25",
                           "--strategy.bucket_mb", "0"],
}
NPROC = [2, 3, 4]


def _strategy(args: list[str]) -> Strategy:
    bucket = float(args[args.index("--strategy.bucket_mb") + 1]) if "--strategy.bucket_mb" in args else 25.0
    return Strategy(bucket_mb=bucket)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1, help="measured runs per process count (median taken)")
    ap.add_argument("--jobs", default=",".join(JOBS))
    a = ap.parse_args()
    cases = []
    with tempfile.TemporaryDirectory(prefix="plan-acc-") as tmp:
        for name in a.jobs.split(","):
            args = JOBS[name]
            print(f"[{name}] calibrating", file=sys.stderr, flush=True)
            cal = calibrate(args, NPROC, Path(tmp) / f"{name}.json", say=lambda m: print("  " + m, file=sys.stderr))
            points = forecast(cal.base_job(cal.cores), cal.cluster(max(NPROC)), _strategy(args), NPROC)
            measured: dict[int, list[float]] = {p: [] for p in NPROC}
            for r in range(a.repeat):
                for p in (NPROC if r % 2 == 0 else NPROC[::-1]):  # alternate the order against drifting load
                    s = run_train(RunSpec(p, args, Path(tmp) / f"{name}-{p}-{r}.json", f"{p} processes"), 600)
                    measured[p].append(job_step_time(s))
            for pt in points:
                m = statistics.median(measured[pt.world_size])
                err = pt.step_time_s / m - 1
                cases.append({"job": name, "nproc": pt.world_size, "forecast_step_s": round(pt.step_time_s, 5),
                              "measured_step_s": round(m, 5), "measured_runs": [round(x, 5) for x in measured[pt.world_size]],
                              "error": round(err, 4), "forecast_compute_s": round(pt.compute_s, 5),
                              "forecast_comm_s": round(pt.comm_exposed_s, 5), "forecast_straggler_s": round(pt.straggler_s, 5),
                              "contention": cal.contention.get(str(pt.world_size))})
                print(f"  {name} P={pt.world_size}: forecast {pt.step_time_s * 1e3:.1f} ms, measured {m * 1e3:.1f} ms, "
                      f"error {err:+.1%}", file=sys.stderr, flush=True)
    errs = [abs(c["error"]) for c in cases]
    within = sum(e <= 0.15 for e in errs)
    print(json.dumps({"cases": cases, "mean_abs_error": round(statistics.mean(errs), 4), "within_15pct": within,
                      "of": len(cases)}))


if __name__ == "__main__":
    main()
