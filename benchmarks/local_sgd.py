"""Local SGD (H = 2, 4, 8) against synchronous DDP: training loss against wall-clock, time to a loss target.

Output contract: the last stdout line is one json object.

2 Gloo processes, mlp width 1024 on digits, 32 samples per process, same learning rate for all, no
warm-up. The loss is rank 0's training loss averaged over each window of --every steps (the trainer's
log points); time is seconds since the first step. Local SGD's replicas are averaged at the end, so
the final evaluation (the whole held-out split, exact) scores one model. Rounds alternate the runs;
figures are medians over rounds. Last line: one JSON object.
Run: python benchmarks/local_sgd.py [--rounds 2 --steps 200 --target 0.2]
"""

from __future__ import annotations

import argparse
import statistics

from _common import emit, train_summary

JOB = ["--nproc", "2", "--model", "mlp", "--model.width", "1024", "--model.depth", "2", "--data", "digits",
       "--batch-size", "32", "--optim.lr", "0.05", "--log.skip_first", "5"]
RUNS = {"ddp": [], "local_sgd2": ["--strategy.local_sgd_period", "2"],
        "local_sgd4": ["--strategy.local_sgd_period", "4"], "local_sgd8": ["--strategy.local_sgd_period", "8"]}


def time_to(curve: list[list[float]], target: float) -> float | None:
    """Seconds until the windowed training loss first reaches ``target`` (None: never)."""
    return next((t for _, t, loss in curve if loss <= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.2)
    a = ap.parse_args()
    res: dict[str, dict[str, list]] = {k: {"t": [], "acc": [], "loss": [], "step": [], "bytes": []} for k in RUNS}
    for r in range(a.rounds):
        for name, extra in RUNS.items():
            s = train_summary([*JOB, "--steps", str(a.steps), "--log.every", str(a.every), *extra])
            t = time_to(s["loss_curve"], a.target)
            d = res[name]
            d["t"].append(t)
            d["acc"].append(s["eval_accuracy"])
            d["loss"].append(s["loss_curve"][-1][2])
            d["step"].append(s["global_batch"] / s["samples_per_s"])
            d["bytes"].append(s["comm_bytes_per_step"])
            curve = " ".join(f"{t:.1f}s:{loss:.2f}" for _, t, loss in s["loss_curve"][:: max(1, len(s["loss_curve"]) // 8)])
            print(f"round {r + 1} {name:11s} to loss {a.target}: {t if t is None else round(t, 2)} s  "
                  f"step {d['step'][-1] * 1e3:.1f} ms  eval acc {s['eval_accuracy']:.4f}  curve {curve}", flush=True)
    out = {}
    for name, d in res.items():
        reached = [t for t in d["t"] if t is not None]
        out[name] = {"time_to_target_s": statistics.median(reached) if len(reached) == len(d["t"]) else None,
                     "eval_accuracy": statistics.median(d["acc"]), "final_train_loss": statistics.median(d["loss"]),
                     "step_s": statistics.median(d["step"]), "comm_bytes_per_step": d["bytes"][-1],
                     "target_loss": a.target}
    emit(out)


if __name__ == "__main__":
    main()
