"""What one kernel read between two training steps costs the step, against its own time in a loop.

One process, one thread: a small MLP's step (about 1 ms here), in chunks of 24 steps alternated ABBA (on, off,
off, on); in the "on" chunks each step is followed by one ``os.pread`` of the thread's schedstat (``pread``), one
``time.thread_time_ns()`` (``clock``, a syscall too) or nothing (``none``, the control). ``group_ratio``: the median
over ABBA groups of the training thread's CPU per step, on over off; ``extra_us``: what that adds per step;
``loop_us``: the same read timed back to back. Last line: one JSON object.

    python benchmarks/syscall_cost.py [pread|clock|none] [--chunks 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import torch
from _common import emit
from doctor_accounting import group_ratios
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="pread", choices=("pread", "clock", "none"), help="default: pread")
    ap.add_argument("--chunks", type=int, default=200, help="chunks of 24 steps (half of them on)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    reads = {"pread": lambda: os.pread(fd, 96, 0).split(), "clock": time.thread_time_ns, "none": lambda: None}
    read = reads[a.mode]

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(50):
        step()
    on: list[float] = []
    off: list[float] = []
    for c in range(a.chunks):
        active = c % 4 in (0, 3)
        c0 = time.thread_time()
        for _ in range(24):
            step()
            if active:
                read()
        (on if active else off).append((time.thread_time() - c0) / 24)
    groups = group_ratios({"on": on, "off": off})
    t0 = time.perf_counter()
    for _ in range(10000):
        read()
    loop_us = (time.perf_counter() - t0) / 10000 * 1e6
    ratio, step_us = statistics.median(groups), statistics.median(off) * 1e6
    emit({"mode": a.mode, "step_us": round(step_us, 1), "group_ratio": round(ratio, 4),
          "extra_us": round((ratio - 1) * step_us, 1), "loop_us": round(loop_us, 2), "groups": len(groups)})


if __name__ == "__main__":
    main()
