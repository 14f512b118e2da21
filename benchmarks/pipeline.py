"""Pipelining against a naive model split, auto against uniform split, and DDP vs pipeline vs hybrid at 4 processes.

Output contract: the last stdout line is one json object.

The model is ``trainscale.models.planted``: an MLP whose layers sleep for a planted time per sample
(forward; backward 2x), so that two processes on this 2-core machine behave like two devices and
the stages' compute is known. Each comparison runs in one launched job, the variants alternating
round after round; figures are medians over rounds, spreads (max - min) / median of the per-round
ratios.

1. 2 processes, 2 stages, 4 equal layers, batch 32: naive split (1 micro-batch, GPipe: stage 1 waits
   for stage 0, then stage 0 for stage 1, as in PyTorch's model-parallel tutorial) against pipelined
   (8 micro-batches, 1F1B). ``pipelined_vs_naive`` = naive step time / pipelined step time.
2. Same processes, 4 layers with the first one 4x heavier: ``split uniform`` against ``split auto``
   (each layer profiled on the real micro-batch, balanced partition): stage imbalance and step time.
3. 4 processes, 4 equal layers, global batch 64: DDP (4 replicas), a 4-stage pipeline, a 2x2 hybrid,
   8 micro-batches; throughput ratios against DDP.

Run: python benchmarks/pipeline.py [--rounds 3 --us 1000]
"""

from __future__ import annotations

import argparse
import statistics

from _common import emit, launch_runs, spread

PLANTED = "trainscale.models.planted:"


def job(model: str, us: int, batch: int, steps: int, *extra: str) -> list[str]:
    return ["--model.name", PLANTED + model, "--model.depth", "4", "--model.width", str(us), "--data.name",
            "synthetic", "--data.image_size", "8", "--data.channels", "1", "--data.eval_size", "0",
            "--data.batch_size", str(batch), "--job.steps", str(steps), "--log.skip_first", "2", *extra]


def pipe(stages: int, m: int, schedule: str = "1f1b", split: str = "uniform") -> list[str]:
    return ["--strategy.pipeline_stages", str(stages), "--strategy.microbatches", str(m),
            "--strategy.schedule", schedule, "--strategy.split", split]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--us", type=int, default=1000, help="planted forward microseconds per sample per layer")
    a = ap.parse_args()
    two = {"naive": job("balanced", a.us, 32, a.steps, *pipe(2, 1, "gpipe")),
           "pipelined": job("balanced", a.us, 32, a.steps, *pipe(2, 8)),
           "uniform": job("one_heavy", a.us, 32, a.steps, *pipe(2, 8)),
           "auto": job("one_heavy", a.us, 32, a.steps, *pipe(2, 8, split="auto"))}
    four = {"ddp": job("balanced", a.us, 16, a.steps), "pipeline4": job("balanced", a.us, 64, a.steps, *pipe(4, 8)),
            "hybrid2x2": job("balanced", a.us, 32, a.steps, *pipe(2, 8))}
    r2 = launch_runs(2, [(f"{k}{r}", v) for r in range(a.rounds) for k, v in two.items()])
    r4 = launch_runs(4, [(f"{k}{r}", v) for r in range(a.rounds) for k, v in four.items()])
    step = {k: [s[f"{k}{r}"]["step_time_s"] for r in range(a.rounds)] for s, keys in ((r2, two), (r4, four))
            for k in keys}
    imb = {k: [r2[f"{k}{r}"]["pipeline"]["imbalance"] for r in range(a.rounds)] for k in ("uniform", "auto")}
    ratio = {k: [n / p for n, p in zip(step[num], step[den])] for k, (num, den) in {
        "pipelined_vs_naive": ("naive", "pipelined"), "auto_vs_uniform": ("uniform", "auto"),
        "pipeline4_vs_ddp": ("ddp", "pipeline4"), "hybrid_vs_ddp": ("ddp", "hybrid2x2")}.items()}
    med = statistics.median
    result = {
        "pipelined_vs_naive": med(ratio["pipelined_vs_naive"]), "pipelined_vs_naive_spread":
            spread(ratio["pipelined_vs_naive"]), "naive_step_s": med(step["naive"]),
        "pipelined_step_s": med(step["pipelined"]),
        "bubble_naive": r2["naive0"]["pipeline"]["bubble_measured"],
        "bubble_pipelined": r2["pipelined0"]["pipeline"]["bubble_measured"],
        "split_uniform_imbalance": med(imb["uniform"]), "split_auto_imbalance": med(imb["auto"]),
        "split_uniform_step_s": med(step["uniform"]), "split_auto_step_s": med(step["auto"]),
        "auto_vs_uniform": med(ratio["auto_vs_uniform"]), "auto_vs_uniform_spread": spread(ratio["auto_vs_uniform"]),
        "split_auto_boundaries": r2["auto0"]["pipeline"]["boundaries"],
        "split_uniform_boundaries": r2["uniform0"]["pipeline"]["boundaries"],
        "ddp_step_s": med(step["ddp"]), "pipeline4_step_s": med(step["pipeline4"]),
        "hybrid_step_s": med(step["hybrid2x2"]),
        "pipeline4_vs_ddp": med(ratio["pipeline4_vs_ddp"]), "pipeline4_vs_ddp_spread": spread(ratio["pipeline4_vs_ddp"]),
        "hybrid_vs_ddp": med(ratio["hybrid_vs_ddp"]), "hybrid_vs_ddp_spread": spread(ratio["hybrid_vs_ddp"]),
        "rounds": a.rounds, "us_per_sample": a.us,
    }
    for k, v in result.items():
        if k not in ("rounds", "us_per_sample"):
            print(f"{k:28s} {v if isinstance(v, list) else f'{v:.4g}'}")
    emit(result)


if __name__ == "__main__":
    main()
