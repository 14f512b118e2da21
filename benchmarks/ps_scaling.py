"""Updates per second of trainscale's ``async`` parameter server for S = 1, 2, 4 shards and P = 2, 4, 8 learners.

The model is an MLP of ``--depth`` hidden layers of ``--width`` units on digits (default 5 x 512: 1.09 M
parameters, 4.35 MB, four 512 x 512 matrices so that 1, 2 and 4 shards get balanced slices). One Ray
instance and one set of actors serve every run; for each P the shard counts run in turn, the order
reversed every repeat, and each cell reports the median of the repeats with its spread. Beside the rate,
the CPU seconds each role used per update (learners, shards, driver, Ray's raylet and GCS) and the cores
the whole run kept busy, read from /proc: on a machine whose cores are all busy, more shards cannot add
throughput, whatever the design. Writes ``<out>/scaling.md``, ``scaling.json`` and ``scaling.png``; the
last line of stdout is one JSON object.

    python benchmarks/ps_scaling.py [--out benchmarks/results/raw/ps-scaling] [--repeats 3] [--updates 150] [--delay none]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import ray
from _common import spread
from _ps_cpu import CpuMeter, ray_daemons

from trainscale.config import load_config
from trainscale.ps.actors import PsActors
from trainscale.ps.job import run_ps

SHARDS, LEARNERS = (1, 2, 4), (2, 4, 8)


def one_run(actors: PsActors, p: int, s: int, args: argparse.Namespace, roles: dict) -> dict:
    """One async run with P learners and S shards: updates/s and CPU seconds per update by role."""
    cfg = load_config(["--ps.mode", "async", "--ps.learners", str(p), "--ps.shards", str(s), "--ps.steps",
                       str(args.updates), "--model.width", str(args.width), "--model.depth", str(args.depth),
                       "--data.batch_size", "32", "--ps.lr", "0.01", "--ps.delay", args.delay,
                       "--ps.snapshot_every", "1000", "--log.progress", "none"])
    meter = CpuMeter({"learners": roles["learners"][:p], "shards": roles["shards"][:s], "driver": [os.getpid()],
                      "ray": roles["ray"]})
    meter.start()
    summary = run_ps(cfg, actors=actors)
    cpu = meter.stop()
    seconds = summary["timeline"][-1]["t"]
    return {"updates_per_s": summary["updates"] / seconds,
            "cpu_ms_per_update": {k: 1e3 * v / summary["updates"] for k, v in cpu.items()},
            "cores_busy": sum(cpu.values()) / summary["wall_s"], "phases_ms": summary["phases_ms"]}


def report(cells: dict, args: argparse.Namespace, numel: int) -> str:
    """The Markdown table of the grid."""
    lines = [f"# Shard scaling of `async` (model {numel:,} parameters, {numel * 4 / 1e6:.2f} MB; delay "
             f"{args.delay}; {args.updates} updates per run, median of {args.repeats})", "",
             "| P | S | updates/s | spread | vs S=1 | cores busy | CPU ms/update: learners | shards | driver | "
             "raylet+GCS |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in LEARNERS:
        base = cells[(p, 1)]["updates_per_s"]
        for s in SHARDS:
            c = cells[(p, s)]
            cpu = c["cpu_ms_per_update"]
            lines.append(f"| {p} | {s} | {c['updates_per_s']:.1f} | {c['spread']:.2f} | "
                         f"{c['updates_per_s'] / base:.2f}x | {c['cores_busy']:.2f} | {cpu['learners']:.2f} | "
                         f"{cpu['shards']:.2f} | {cpu['driver']:.2f} | {cpu['ray']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(cells: dict, path: Path) -> None:
    """updates/s against shards, one line per P."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for p in LEARNERS:
        ax.errorbar(SHARDS, [cells[(p, s)]["updates_per_s"] for s in SHARDS],
                    yerr=[[cells[(p, s)]["updates_per_s"] - cells[(p, s)]["min"] for s in SHARDS],
                          [cells[(p, s)]["max"] - cells[(p, s)]["updates_per_s"] for s in SHARDS]],
                    marker="o", capsize=3, label=f"P = {p}")
    ax.set_xlabel("server shards S")
    ax.set_ylabel("updates / s")
    ax.set_xticks(SHARDS)
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title("async, 4.35 MB model, 2-core machine")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/raw/ps-scaling")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--updates", type=int, default=150)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--delay", default="none", help="injected delay per mini-batch (ps.delay)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    runs: dict = {}
    try:
        actors = PsActors(max(LEARNERS), max(SHARDS))
        try:
            roles = {"learners": ray.get([a.pid.remote() for a in actors.learners], timeout=120),
                     "shards": ray.get([a.pid.remote() for a in actors.shards], timeout=120), "ray": ray_daemons()}
            one_run(actors, max(LEARNERS), 1, argparse.Namespace(**{**vars(args), "updates": 20}), roles)  # warm-up
            for r in range(args.repeats):
                for p in LEARNERS:
                    for s in (SHARDS if r % 2 == 0 else SHARDS[::-1]):
                        res = one_run(actors, p, s, args, roles)
                        runs.setdefault((p, s), []).append(res)
                        print(f"repeat {r} P={p} S={s}: {res['updates_per_s']:.1f} updates/s, "
                              f"cores busy {res['cores_busy']:.2f}", flush=True)
        finally:
            actors.close()
    finally:
        ray.shutdown()
    cells = {}
    for key, rs in runs.items():
        rates = [x["updates_per_s"] for x in rs]
        mid = sorted(rs, key=lambda x: x["updates_per_s"])[len(rs) // 2]
        cells[key] = {**mid, "updates_per_s": statistics.median(rates), "rounds": rates, "spread": spread(rates),
                      "min": min(rates), "max": max(rates)}
    numel = 64 * args.width + args.width + (args.depth - 1) * (args.width ** 2 + args.width) + args.width * 10 + 10
    md = report(cells, args, numel)
    (out / "scaling.md").write_text(md)
    result = {"delay": args.delay, "numel": numel, "repeats": args.repeats, "updates": args.updates,
              "cells": [{"learners": p, "shards": s, **c} for (p, s), c in sorted(cells.items())]}
    (out / "scaling.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(cells, out / "scaling.png")
    print(md)
    p4 = {s: cells[(4, s)]["updates_per_s"] for s in SHARDS}
    print(json.dumps({"p4_updates_s": {str(s): round(v, 1) for s, v in p4.items()},
                      "p4_s2_over_s1": round(p4[2] / p4[1], 3), "p4_s4_over_s1": round(p4[4] / p4[1], 3),
                      "p4_cores_busy": {str(s): round(cells[(4, s)]["cores_busy"], 2) for s in SHARDS}}))


if __name__ == "__main__":
    main()
