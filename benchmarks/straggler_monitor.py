"""The live straggler monitor's and the Flight Recorder's cost on the step, 2 processes, same job.

1. **The monitor** (``log.stragglers``), inside one run: a loop on the run API hands the run's monitor its
   steps in some chunks of 24 and not in others (ABBA order; the run's monitor switched out of the
   instruments' hooks and back between chunks, ``Instruments.switch``); ``overhead_ratio`` is the median over ABBA groups of chunks (on, off, off,
   on) of their ratio of clipped mean step times, with its 90% bootstrap interval, and ``cpu_ratio`` the same for the
   training thread's CPU time (as ``doctor_accounting.py`` measures the time accounting). The monitor's side
   thread keeps running in both: what is switched is what the training thread pays and the windows it sends.
   A second launch, with the monitor on throughout and half as many chunks, reads each rank's side thread CPU time
   (its ``schedstat``) per step, and the training thread's cost per ``step`` call is timed in a loop:
   ``overhead_bound_ratio`` is 1 + both per step over that run's step time, what the monitor would add if every
   microsecond of every rank's side thread lay on the step's critical path. Unlike the ratio, it resolves
   fractions of a percent on a noisy machine.
2. **The Flight Recorder** (``TORCH_FR_BUFFER_SIZE``, which trainscale sets to 64 for launched runs): a process
   setting, so whole launches alternate it (64, 0, 0, 64, ...), each timing a loop of one-float all-reduces;
   ``fr_us_per_collective`` is the median difference per collective, and ``fr_step_ratio`` what it adds to
   the job's step (the default job makes one all-reduce per step).

Last line: one JSON object with ``overhead_ratio``, ``overhead_bound_ratio`` and ``fr_step_ratio``.
Run: python benchmarks/straggler_monitor.py [--chunks 300 --launches 4 --every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from doctor_accounting import summary, toggled_chunks

from trainscale.config import LogConfig

JOB = ["--log.progress", "none", "--data.eval_size", "0", "--log.metrics", "false", "--log.skip_first", "3"]
CALLS = 2000  # one-float all-reduces per Flight Recorder launch


def collectives() -> float:
    """Seconds per one-float all-reduce on this process group (the median of 5 rounds)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    x = torch.ones(1)
    for _ in range(200):
        dist.all_reduce(x)
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(CALLS // 5):
            dist.all_reduce(x)
        rounds.append((time.perf_counter() - t0) / (CALLS // 5))
    dist.destroy_process_group()
    return statistics.median(rounds)


def side_cpu_s() -> float:
    """The CPU seconds the monitor's side thread has used so far (its schedstat; 0 before it starts)."""
    t = next((t for t in threading.enumerate() if t.name == "trainscale-stragglers"), None)
    if t is None or t.native_id is None:
        return 0.0
    return int(Path(f"/proc/self/task/{t.native_id}/schedstat").read_text().split()[0]) / 1e9


def call_us(calls: int = 20000) -> float:
    """Microseconds the training thread spends in the monitor's ``step`` (an in-process store, no other rank)."""
    from torch.distributed import HashStore

    from trainscale.train.instruments.stragglers import StragglerMonitor

    mon = StragglerMonitor(HashStore(), rank=1, world=2, every=10, prefix="bench")
    t0 = time.thread_time()
    for i in range(calls):
        mon.step(i, 0.003, 0.0001, 0.0005)
    spent = time.thread_time() - t0
    mon.close()
    return spent / calls * 1e6


def worker(mode: str, chunks: int, every: int, out: str) -> None:
    """One process of a launch: ``fr`` times collectives; ``toggled`` and ``steady`` run the job (the monitor
    switched per chunk, or on throughout: that run's side-thread CPU goes to rank 0 through a file per rank)."""
    if mode == "fr":
        result: dict[str, Any] = {"collective_s": collectives()}
    else:
        job = [*JOB, "--log.straggler_every", str(every)]
        if mode == "toggled":  # the same-run on/off ratio
            result = {"inside": toggled_chunks(chunks, job, "monitor")}
        else:  # the bound: side threads' CPU with the monitor on throughout, and the training thread's call
            result = {"inside": toggled_chunks(chunks, job, "monitor", side_cpu_s, switch=False), "call_us": call_us()}
    rank = int(os.environ["RANK"])
    if rank > 0:  # the other ranks' side threads, which publish but do not score: to rank 0 through a file
        if mode == "steady":
            part = Path(f"{out}.{rank}.part")
            part.write_text(json.dumps(result["inside"]["side_on"]))
            part.rename(f"{out}.{rank}")
        return
    if mode == "steady":
        world, deadline = int(os.environ["WORLD_SIZE"]), time.monotonic() + 60
        others = [Path(f"{out}.{r}") for r in range(1, world)]
        while not all(f.exists() for f in others) and time.monotonic() < deadline:
            time.sleep(0.1)
        result["side_others"] = [json.loads(f.read_text()) for f in others if f.exists()]
    Path(out).write_text(json.dumps(result))


def fr_launches(launches: int) -> dict[str, list[float]]:
    """Seconds per collective with the recorder on (64) and off (0), alternated ABBA over whole launches."""
    from _common import launch_self

    res: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(launches):
        for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
            os.environ["TORCH_FR_BUFFER_SIZE"] = "64" if mode == "on" else "0"
            res[mode].append(launch_self(__file__, ["--mode", "fr"])["collective_s"])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=300, help="chunks of 24 steps in the toggled run (half of them on)")
    ap.add_argument("--every", type=int, default=LogConfig().straggler_every,
                    help="log.straggler_every: steps per window (default the run's, %(default)s; the fault "
                         "benchmark's: 5)")
    ap.add_argument("--launches", type=int, default=4, help="pairs of launches, recorder on and off")
    ap.add_argument("--mode", choices=["toggled", "steady", "fr"], default="toggled", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker_out:
        worker(a.mode, a.chunks, a.every, a.worker_out)
        return
    from _common import emit, launch_self

    r = launch_self(__file__, ["--chunks", str(a.chunks), "--every", str(a.every)])
    steady = launch_self(__file__, ["--mode", "steady", "--chunks", str(a.chunks // 2), "--every", str(a.every)])
    inside = summary(r["inside"], "chunk")
    cpu = summary({"on": r["inside"]["cpu_on"], "off": r["inside"]["cpu_off"]}, "cpu")
    fr = fr_launches(a.launches)
    diffs = [on - off for on, off in zip(fr["on"], fr["off"])]
    fr_us = statistics.median(diffs) * 1e6
    step_s = inside["step_off_s"]
    steady_s = statistics.median(steady["inside"]["on"])
    # An upper bound on what the monitor can take from the step: all of its side threads' CPU on the step's
    # critical path, holding the GIL or the core, plus the training thread's calls. Summed over the ranks: their
    # side threads wake at the same step, but a bound must not count on them overlapping.
    # From the run with the monitor on throughout: the side thread pauses between wake-ups and scores several
    # windows at once, fewer of them per wake-up in a run that switches the monitor off half of the time.
    per_rank = [statistics.mean(xs) * 1e6 for xs in [steady["inside"]["side_on"], *steady["side_others"]] if xs]
    if len(per_rank) < 2 or not all(per_rank):  # a bound from a thread it could not find would understate the cost
        sys.exit("straggler_monitor: no side-thread CPU read on some rank (no thread named trainscale-stragglers?)")
    side_us = sum(per_rank)
    bound = 1 + (side_us + steady["call_us"]) * 1e-6 / steady_s
    print(f"monitor: side thread {', '.join(f'{x:.2f}' for x in per_rank)} us of CPU per step (rank 0, 1, ...), "
          f"training thread {steady['call_us']:.3f} us per call; at most {(bound - 1) * 100:.3f}% of a "
          f"{steady_s * 1e3:.3f} ms step",
          file=sys.stderr)
    print(f"flight recorder: {statistics.median(fr['on']) * 1e6:.1f} us per all-reduce on, "
          f"{statistics.median(fr['off']) * 1e6:.1f} off; {fr_us:+.2f} us per collective", file=sys.stderr)
    emit({"overhead_ratio": inside["ratio"], "ratio_ci90": [inside["lo"], inside["hi"]],
          "ratio_p10": inside["p10"], "ratio_p90": inside["p90"], "chunk_pairs": inside["pairs"],
          "step_off_s": step_s, "cpu_ratio": cpu["ratio"], "cpu_ratio_ci90": [cpu["lo"], cpu["hi"]],
          "side_cpu_us_per_step": side_us, "side_cpu_us_per_rank": per_rank, "call_us": steady["call_us"],
          "overhead_bound_ratio": bound, "steady_step_s": steady_s,
          "fr_us_per_collective": fr_us, "fr_us_spread": [min(diffs) * 1e6, max(diffs) * 1e6],
          "fr_step_ratio": 1 + max(fr_us, 0.0) * 1e-6 / step_s, "fr_launch_pairs": len(diffs),
          "straggler_every": a.every})


if __name__ == "__main__":
    main()
