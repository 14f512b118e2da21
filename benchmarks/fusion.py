"""Fused all-reduce buckets (DDP default 25 MB) against one all-reduce per gradient tensor.

Output contract: the last stdout line is one json object.

2 processes on Gloo, resnet50 at width 4 (161 gradient tensors, as in a PaddlePaddle launcher log), the
two settings alternated --repeat times in the same run. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import statistics

from _common import emit, spread, train_summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=25)
    a = ap.parse_args()
    job = ["--nproc", "2", "--model", "resnet50", "--model.width", "4", "--data", "synthetic",
           "--data.image_size", "16", "--batch-size", "8", "--steps", str(a.steps), "--data.eval_size", "0",
           "--log.skip_first", "5"]
    fused, per_tensor = [], []
    for i in range(a.repeat):
        f = train_summary(job)
        p = train_summary(job + ["--strategy.bucket_mb", "0"])
        fused.append(f["step_time_s"])
        per_tensor.append(p["step_time_s"])
        print(f"round {i + 1}: fused {f['step_time_s'] * 1e3:.1f} ms ({f['allreduce_calls_per_step']} calls), "
              f"per-tensor {p['step_time_s'] * 1e3:.1f} ms ({p['allreduce_calls_per_step']} calls)", flush=True)
    fs, ps = statistics.median(fused), statistics.median(per_tensor)
    emit({"fused_step_s": fs, "per_tensor_step_s": ps, "fused_calls": f["allreduce_calls_per_step"],
          "per_tensor_calls": p["allreduce_calls_per_step"], "speedup": ps / fs,
          "fused_spread": spread(fused), "per_tensor_spread": spread(per_tensor), "repeat": a.repeat})


if __name__ == "__main__":
    main()
