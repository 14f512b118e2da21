"""The fault benchmark's job: a small MLP on the run API, with at most one fault from ``TRAINSCALE_BENCH_FAULT``.

    TRAINSCALE_BENCH_FAULT=KIND:RANK:STEP:AMOUNT trainscale launch --nproc-per-node 2 benchmarks/campaigns/_fault_job.py

KIND (rank RANK, from optimizer step STEP on, 1-based):

- ``sleep``: AMOUNT seconds of sleep in each step's forward (compute);
- ``gc``: AMOUNT ``gc.collect()`` calls in each step's forward (compute);
- ``data``: AMOUNT seconds of sleep in the collate of each batch from batch STEP (data);
- ``neighbour``: this rank's training thread pinned to one core, with AMOUNT CPU-bound processes pinned there
  too (cpu_contention); ``quota``: this rank's threads moved into a cgroup (v1 ``cpu.cfs_quota_us``, a 10 ms
  period) of AMOUNT of one core (cpu_contention);
- ``stop`` / ``kill``: SIGSTOP / SIGKILL to itself after step STEP;
- ``skip``: the rank skips the metric all-reduce that every rank makes every ``METRIC_EVERY`` steps (the first one
  at or after STEP); ``shape``: it gives that all-reduce another shape.

With ``TRAINSCALE_BENCH_ONSET=FILE`` the faulty rank writes ``time.time()`` there when the fault starts. With
``TRAINSCALE_BENCH_TIMES=DIR`` each rank writes ``DIR/steps.RANK.json``: each step's wall time by its own clock
(batch to the end of the step), taken apart from trainscale's instruments, so that the benchmark can measure how
much a planted fault slowed the job. With ``TRAINSCALE_BENCH_WINDOWS=FILE`` rank 0 appends there every window its
straggler detector scores (per rank: step, compute, data wait, run-queue wait, the cores others used on its host), for
``straggler_replay.py``. Other arguments (``--section.field VALUE``) go to the run configuration.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

import trainscale

ENV = "TRAINSCALE_BENCH_FAULT"
METRIC_EVERY = 10  # steps between the metric all-reduces (every run makes them, clean ones too)
CGROUP = "/sys/fs/cgroup/cpu/trainscale-fault-bench"  # the quota fault's cgroup (v1); the benchmark removes it
QUOTA_PERIOD_US = 10_000
BUSY = "import os,sys,time\nos.sched_setaffinity(0,{int(sys.argv[1])})\nend=time.time()+float(sys.argv[2])\n" \
       "while time.time()<end: pass\n"


class Fault:
    def __init__(self, spec: str, rank: int):
        kind, r, step, amount = (spec.split(":") + ["", "", "", ""])[:4] if spec else ("", "-1", "0", "0")
        self.kind, self.step, self.amount = kind, int(step or 0), float(amount or 0)
        self.mine = bool(kind) and int(r) == rank
        self.started = False
        self.batches = 0
        self.neighbours: list[subprocess.Popen] = []

    def onset(self) -> None:
        if not self.started:
            self.started = True
            if path := os.environ.get("TRAINSCALE_BENCH_ONSET"):
                Path(path).write_text(repr(time.time()))

    def collate(self, batch: list) -> object:
        """The loader's collate: slow from batch ``step`` on the data-faulty rank."""
        self.batches += 1
        if self.mine and self.kind == "data" and self.batches >= self.step:
            self.onset()
            time.sleep(self.amount)
        return default_collate(batch)

    def forward(self, step: int) -> None:
        """In step ``step``'s forward (its compute)."""
        if not self.mine or step < self.step:
            return
        if self.kind == "sleep":
            self.onset()
            time.sleep(self.amount)
        elif self.kind == "gc":
            self.onset()
            for _ in range(int(self.amount)):
                gc.collect()
        elif self.kind == "neighbour" and not self.started:
            self.onset()
            core = sorted(os.sched_getaffinity(0))[-1]
            os.sched_setaffinity(0, {core})  # this (the training) thread only
            self.neighbours = [subprocess.Popen([sys.executable, "-c", BUSY, str(core), "120"])
                               for _ in range(int(self.amount))]
        elif self.kind == "quota" and not self.started:
            self.onset()
            os.makedirs(CGROUP, exist_ok=True)
            # A 10 ms period (a container's is 100 ms): the job's steps take milliseconds, so that the quota
            # slows every step rather than stopping the rank for 80 ms every tenth step.
            Path(CGROUP, "cpu.cfs_period_us").write_text(str(QUOTA_PERIOD_US))
            Path(CGROUP, "cpu.cfs_quota_us").write_text(str(int(self.amount * QUOTA_PERIOD_US)))
            for tid in os.listdir("/proc/self/task"):  # every thread of this rank (cgroup v1 moves threads)
                try:
                    Path(CGROUP, "tasks").write_text(tid)
                except OSError:
                    pass  # a thread that ended meanwhile

    def after_step(self, step: int) -> None:
        if self.mine and step == self.step and self.kind in ("stop", "kill"):
            self.onset()
            os.kill(os.getpid(), signal.SIGSTOP if self.kind == "stop" else signal.SIGKILL)

    def metric(self, step: int) -> torch.Tensor | None:
        """The metric all-reduce's tensor at step ``step`` (None: this rank skips it)."""
        x = torch.ones(3)
        if self.mine and step >= self.step and not self.started and self.kind in ("skip", "shape"):
            self.onset()
            return None if self.kind == "skip" else torch.ones(4)
        return x

    def close(self) -> None:
        for p in self.neighbours:
            p.kill()
            p.wait()


def log_windows(path: str) -> None:
    """Keep every window the straggler detector scores (only rank 0 has one) in ``path``, a JSON line each."""
    from trainscale.train.instruments.straggler_detector import StragglerDetector

    update = StragglerDetector.update

    def logged(self: StragglerDetector, windows: list) -> list:
        with open(path, "a") as f:
            # One number for the gate's input, as the replay reads it: infinite where the quota held the rank.
            f.write(json.dumps([[w.step, w.compute_s, w.wait_s, w.runq_s, math.inf if w.held else w.other_cores]
                                for w in windows]) + "\n")
        return update(self, windows)

    StragglerDetector.update = logged  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--hidden", type=int, default=256)
    a, config = p.parse_known_args()
    if path := os.environ.get("TRAINSCALE_BENCH_WINDOWS"):
        log_windows(path)
    run = trainscale.init(args=["--data.batch_size", "32", *config])
    fault = Fault(os.environ.get(ENV, ""), run.env.rank)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g))
    model = nn.Sequential(nn.Linear(64, a.hidden), nn.ReLU(), nn.Linear(a.hidden, a.hidden), nn.ReLU(),
                          nn.Linear(a.hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(data, batch_size=32, shuffle=True, collate_fn=fault.collate)
    model, opt, loader = run.prepare(model, opt, loader)
    steps: list[float] = []  # each step's wall time, batch included
    try:
        t = time.perf_counter()
        for x, y in run.batches(loader, steps=a.steps):
            step = run.step_count + 1
            fault.forward(step)
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step()
            if step % METRIC_EVERY == 0:
                metric = fault.metric(step)
                if metric is not None:
                    run.all_reduce(metric)
            fault.after_step(step)
            steps.append(time.perf_counter() - t)
            t = time.perf_counter()
    finally:
        fault.close()
    if times := os.environ.get("TRAINSCALE_BENCH_TIMES"):
        Path(times, f"steps.{run.env.rank}.json").write_text(json.dumps(steps))
    summary = run.finish()
    if run.is_main:  # the benchmark reads the summary file; this line is the job's own result, for a person
        print(json.dumps({"job": "fault", "steps": run.step_count, "stragglers": len(summary.get("stragglers", []))}),
              flush=True)


if __name__ == "__main__":
    main()
