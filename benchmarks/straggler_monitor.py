"""The live straggler monitor's and the Flight Recorder's cost on the step, 2 processes, same job.

1. **The monitor** (``log.stragglers``), inside one run: a loop on the run API hands the run's monitor its
   steps in some chunks of 24 and not in others (ABBA order; the instruments' ``monitor`` set to the run's
   own or to None between chunks); ``overhead_ratio`` is the median over ABBA groups of chunks (on, off, off,
   on) of their ratio of clipped mean step times, with its 90% bootstrap interval, and ``cpu_ratio`` the same for the
   training thread's CPU time (as ``doctor_accounting.py`` measures the time accounting). The monitor's side
   thread keeps running in both: what is switched is what the training thread pays and the windows it sends.
2. **The Flight Recorder** (``TORCH_FR_BUFFER_SIZE``, which trainscale sets to 64 for launched runs): a process
   setting, so whole launches alternate it (64, 0, 0, 64, ...), each timing a loop of one-float all-reduces;
   ``fr_us_per_collective`` is the median difference per collective, and ``fr_step_ratio`` what it adds to
   the job's step (the default job makes one all-reduce per step).

Last line: one JSON object with ``overhead_ratio`` and ``fr_step_ratio``.
Run: python benchmarks/straggler_monitor.py [--chunks 300 --launches 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from doctor_accounting import summary, toggled_chunks

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


def worker(chunks: int, out: str, fr_only: bool) -> None:
    result = {"collective_s": collectives()} if fr_only else {"inside": toggled_chunks(chunks, JOB, "monitor")}
    if int(os.environ["RANK"]) == 0:
        Path(out).write_text(json.dumps(result))


def fr_launches(launches: int) -> dict[str, list[float]]:
    """Seconds per collective with the recorder on (64) and off (0), alternated ABBA over whole launches."""
    from _common import launch_self

    res: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(launches):
        for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
            os.environ["TORCH_FR_BUFFER_SIZE"] = "64" if mode == "on" else "0"
            res[mode].append(launch_self(__file__, ["--fr-only"])["collective_s"])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=300, help="chunks of 24 steps in the toggled run (half of them on)")
    ap.add_argument("--launches", type=int, default=4, help="pairs of launches, recorder on and off")
    ap.add_argument("--fr-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker_out:
        worker(a.chunks, a.worker_out, a.fr_only)
        return
    from _common import emit, launch_self

    r = launch_self(__file__, ["--chunks", str(a.chunks)])
    inside = summary(r["inside"], "chunk")
    cpu = summary({"on": r["inside"]["cpu_on"], "off": r["inside"]["cpu_off"]}, "cpu")
    fr = fr_launches(a.launches)
    diffs = [on - off for on, off in zip(fr["on"], fr["off"])]
    fr_us = statistics.median(diffs) * 1e6
    step_s = inside["step_off_s"]
    print(f"flight recorder: {statistics.median(fr['on']) * 1e6:.1f} us per all-reduce on, "
          f"{statistics.median(fr['off']) * 1e6:.1f} off; {fr_us:+.2f} us per collective", file=sys.stderr)
    emit({"overhead_ratio": inside["ratio"], "ratio_ci90": [inside["lo"], inside["hi"]],
          "ratio_p10": inside["p10"], "ratio_p90": inside["p90"], "chunk_pairs": inside["pairs"],
          "step_off_s": step_s, "cpu_ratio": cpu["ratio"], "cpu_ratio_ci90": [cpu["lo"], cpu["hi"]],
          "fr_us_per_collective": fr_us, "fr_us_spread": [min(diffs) * 1e6, max(diffs) * 1e6],
          "fr_step_ratio": 1 + max(fr_us, 0.0) * 1e-6 / step_s, "fr_launch_pairs": len(diffs)})


if __name__ == "__main__":
    main()
