"""The per-rank time accounting's cost on the step: ``log.accounting`` on against off, 2 processes, same job.

One launched job of 2 processes runs the doctor's kind of run (``trainscale train``'s Trainer, the default
job, ``--ablate.phases base,no_data,no_comm`` in blocks of 8) again and again in the same process group,
alternating accounting on and off in ABBA order, so that drift and a slow spell of the shared machine fall on
both. A run's step time is its mean over measured steps (global batch / samples per second): the accounting's
per-block reads land on single steps, which a median would hide. The result is the median over pairs of the
on/off ratio, with the 10th-90th percentile spread of those ratios.

Then, in the same processes, the cost of each read: the training thread's schedstat (every step), one block's
reads of the other threads with the thread-list rescan, and the alternative of reading every thread at every
step. Last line: one JSON object with ``overhead_ratio``.
Run: python benchmarks/doctor_accounting.py [--pairs 8 --cycles 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

JOB = ["--log.progress", "none", "--data.eval_size", "0", "--log.metrics", "false",
       "--ablate.phases", "base,no_data,no_comm", "--ablate.phase_steps", "8"]


def mean_step_s(summary: dict) -> float:
    """Mean seconds per measured step, every step counted (a block's reads land on one step)."""
    return summary["global_batch"] / summary["samples_per_s"]


def read_costs(n: int = 3000) -> dict[str, float]:
    """Microseconds per read, on this rank's live threads (Gloo's, the intra-op pool's, the watchdog's)."""
    from trainscale.train.instruments.accounting import Accounting

    acct = Accounting(0, None, True, 0.0, 0.0)
    acct.schedule(0, 10**9)  # no block closes inside the step timing below
    acct.loop_starts(time.perf_counter())
    t0 = time.perf_counter()
    for i in range(n):
        acct.step_done(i + 1, True, 0.0)
    step_us = (time.perf_counter() - t0) / n * 1e6
    others = acct.others
    assert others is not None
    t0 = time.perf_counter()
    for _ in range(n):
        others.rescan()
        others.read()
    block_us = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for _ in range(n):
        others.read()
    read_us = (time.perf_counter() - t0) / n * 1e6
    threads = len(others.tasks)
    acct.end()
    return {"main_read_us": step_us, "block_read_us": block_us, "thread_read_us": read_us / max(1, threads),
            "other_threads": threads, "every_thread_every_step_us": step_us + read_us}


def worker(pairs: int, steps: int, out: str) -> None:
    from trainscale.config import load_config
    from trainscale.distributed import init_distributed
    from trainscale.train.trainer import Trainer

    base = JOB + ["--job.steps", str(steps)]
    init_distributed(load_config(base).job)  # one process group and thread setting for every run
    times: dict[str, list[float]] = {"on": [], "off": []}
    for p in range(pairs):
        order = ("on", "off") if p % 2 == 0 else ("off", "on")  # ABBA: neither always runs first
        for mode in order:
            cfg = load_config(base + ["--log.accounting", "true" if mode == "on" else "false"])
            times[mode].append(mean_step_s(Trainer(cfg).fit()))
    costs = read_costs()
    threads = threading.active_count()
    if int(os.environ["RANK"]) == 0:
        Path(out).write_text(json.dumps({**times, "costs": costs, "python_threads": threads}))


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=12, help="passes through the 3 phases per run")
    ap.add_argument("--worker-out")
    a = ap.parse_args()
    steps = 3 + a.cycles * 3 * 8
    if a.worker_out:
        worker(a.pairs, steps, a.worker_out)
        return
    from trainscale.distributed import LaunchSpec, launch

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        launch(LaunchSpec(script=__file__, nproc_per_node=2, print_table=False,
                          args=["--pairs", str(a.pairs), "--cycles", str(a.cycles), "--worker-out", str(out)]))
        r = json.loads(out.read_text())
    from _common import emit

    ratios = [on / off for on, off in zip(r["on"], r["off"])]
    for i, (on, off, q) in enumerate(zip(r["on"], r["off"], ratios)):
        print(f"pair {i + 1}: on {on * 1e3:.3f} ms/step, off {off * 1e3:.3f} ms/step, ratio {q:.4f}", file=sys.stderr)
    c = r["costs"]
    step_off = statistics.median(r["off"])
    print(f"reads: training thread {c['main_read_us']:.1f} us/step; other threads ({c['other_threads']}) with "
          f"rescan {c['block_read_us']:.1f} us/block, {c['thread_read_us']:.1f} us per thread; every thread every "
          f"step would cost {c['every_thread_every_step_us']:.1f} us/step", file=sys.stderr)
    emit({"overhead_ratio": statistics.median(ratios), "ratio_p10": quantile(ratios, 0.1),
          "ratio_p90": quantile(ratios, 0.9), "ratio_of_medians": statistics.median(r["on"]) / step_off,
          "step_on_s": statistics.median(r["on"]), "step_off_s": step_off, "pairs": a.pairs, "steps": steps,
          "main_read_us": c["main_read_us"], "block_read_us": c["block_read_us"],
          "thread_read_us": c["thread_read_us"], "other_threads": c["other_threads"],
          "every_thread_every_step_us": c["every_thread_every_step_us"],
          "expected_ratio": 1 + (c["main_read_us"] + c["block_read_us"] / 8) * 1e-6 / step_off})


if __name__ == "__main__":
    main()
