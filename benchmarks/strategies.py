"""Data-parallel strategies against plain DDP in the same run: mean step time and bytes sent per step.

Output contract: the last stdout line is one json object.

Same model and global batch for all: mlp width 1024 (4.5 MB of fp32 gradients) on digits, 32 samples
per process, 1 MB buckets (several buckets, so comm_groups has something to spread). 2 Gloo processes;
hierarchical runs on 4 (2 emulated nodes x 2) and is compared with plain DDP on 4. Rounds alternate
the strategies; each ratio is the median over rounds, its spread is (max - min) / median.
Step time is the mean (global batch / samples per s), so local SGD's averaging steps count in full.
Last line: one JSON object.  Run: python benchmarks/strategies.py [--rounds 2 --steps 40]
"""

from __future__ import annotations

import argparse
import statistics

from _common import emit, spread, train_summary

JOB = ["--model", "mlp", "--model.width", "1024", "--model.depth", "2", "--data", "digits", "--data.eval_size", "0",
       "--strategy.bucket_mb", "1", "--log.skip_first", "5"]
RUNS = {  # name: (processes, extra flags, the DDP baseline it is compared with)
    "ddp": (2, [], "ddp"),
    "fp16": (2, ["--strategy.compression", "fp16"], "ddp"),
    "powersgd": (2, ["--strategy.compression", "powersgd", "--strategy.powersgd_warmup", "2"], "ddp"),
    "comm_groups2": (2, ["--strategy.comm_groups", "2"], "ddp"),
    "local_sgd4": (2, ["--strategy.local_sgd_period", "4"], "ddp"),
    "ddp4": (4, [], "ddp4"),
    "hierarchical": (4, ["--strategy.hierarchical", "true", "--strategy.local_size", "2"], "ddp4"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    step: dict[str, list[float]] = {k: [] for k in RUNS}
    nbytes: dict[str, float] = {}
    wait: dict[str, list[float]] = {k: [] for k in RUNS}
    for r in range(a.rounds):
        for name, (nproc, extra, _) in RUNS.items():
            s = train_summary(["--nproc", str(nproc), "--batch-size", str(64 // nproc), "--steps", str(a.steps),
                               *JOB, *extra])
            step[name].append(s["global_batch"] / s["samples_per_s"])
            nbytes[name] = s["comm_bytes_per_step"]
            wait[name].append(s["comm_wait_s"] or 0.0)
            print(f"round {r + 1} {name:13s} {nproc}p  step {step[name][-1] * 1e3:7.1f} ms  "
                  f"bytes/step {nbytes[name] / 1e6:6.2f} MB  exposed comm {wait[name][-1] * 1e3:6.1f} ms  "
                  f"calls/step {s['allreduce_calls_per_step']}", flush=True)
    result = {}
    for name, (_, _, base) in RUNS.items():
        if name in ("ddp", "ddp4"):
            continue
        ratios = [x / b for x, b in zip(step[name], step[base])]
        result[name] = {"step_ratio": statistics.median(ratios), "bytes_ratio": nbytes[name] / nbytes[base],
                        "step_ratio_spread": spread(ratios), "step_s": statistics.median(step[name]),
                        "baseline_step_s": statistics.median(step[base]),
                        "comm_wait_s": statistics.median(wait[name]), "baseline_comm_wait_s": statistics.median(wait[base])}
    emit(result)


if __name__ == "__main__":
    main()
