"""Per-rank time accounting, measured: where each rank's threads spent each step (``log.accounting``).

Per measured step, this rank records

- the run-queue wait of its training thread (runnable, not running: another process or thread had the CPU)
  and of all its threads (the backend's, the loader's, its workers' processes'), and their on-CPU time, from
  the kernel's schedstat (``schedstat.py``);
- the exposed communication wait of the step (``CommMeter``: from the last gradient to the end of the
  exchange; CPU only);
- when its last gradient became ready, on a clock common to all ranks (``clocks.py``): the rank that
  arrives last at the step's collective is the one the others waited for.

The training thread is read at every step (one ``os.pread``). The other threads are read once per block of
steps (a block of ``ablate.phases``, else ``BLOCK`` steps), and their thread list is rescanned then too: a
block's total is spread evenly over its steps, so ``runq_all_s`` and ``cpu_all_s`` of one step are its own
training thread's time plus 1/n of the block's other threads' time. Reading every thread at every step would
cost several times more (``benchmarks/doctor_accounting.py``).
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import threading
import time
from typing import Any

from .accounting_summary import local_cpu_limits
from .clocks import measure_offset
from .phases import ROW_COLUMNS
from .schedstat import THREAD_CLASSES, TaskStat, ThreadSet, available

__all__ = ["Accounting", "start_accounting", "BLOCK", "NAN_ROW"]

BLOCK = 8  # steps per read of the other threads when no phase plan sets the block
NAN_ROW = [math.nan] * (len(ROW_COLUMNS) - 4)  # rank_steps columns 4-8 of a step without accounting
_RUNS = itertools.count()  # a key of the store per run of this process (a script may start several)


def start_accounting(rank: int, world: int, store: Any, meter: Any, device_type: str, attempt: int) -> Accounting:
    """Measure the clock offset to rank 0 (collective: every rank calls it) and open this rank's accounting."""
    key = f"trainscale/clock/{attempt}/{next(_RUNS)}"
    offset, bound = measure_offset(store, rank, world, key)
    return Accounting(rank, meter, device_type == "cpu", offset, bound)


class Accounting:
    """This rank's per-step accounting; the instruments call ``step_called``, ``step_done`` and the block seams."""

    def __init__(self, rank: int, meter: Any, comm_measured: bool, offset: float, bound: float):
        self.rank, self.meter, self.offset, self.bound = rank, meter, offset, bound
        self.comm_measured = comm_measured and meter is not None and meter.hooked
        self.reason = available()
        self.warm, self.block = 0, BLOCK
        self.origin = math.nan  # the loop's start, on rank 0's clock
        self.main: TaskStat | None = None
        self.others: ThreadSet | None = None
        if self.reason is None:
            tid = threading.get_native_id()  # the training thread: the one that builds the run
            self.main = TaskStat(f"/proc/self/task/{tid}/schedstat", "main", True)
            self.others = ThreadSet(tid)
            self.others.rescan()
        # per measured step (seconds)
        self.runq_main: list[float] = []
        self.cpu_main: list[float] = []
        self.runq_others: list[float] = []  # the block's share; NaN until the block closes
        self.cpu_others: list[float] = []
        self.comm_wait: list[float] = []
        self.arrival: list[float] = []
        # per class, summed over measured steps (ns)
        self.cpu_ns = dict.fromkeys(THREAD_CLASSES, 0.0)
        self.runq_ns = dict.fromkeys(THREAD_CLASSES, 0.0)
        self._block_steps = 0
        self._block_measured: list[int] = []
        self._waits_seen = 0
        self._t_call = 0.0

    # ---- the step's seams
    def schedule(self, warm: int, block: int) -> None:
        """Steps 1..``warm`` are not measured; the other threads are read every ``block`` steps after them
        (0: every ``BLOCK``)."""
        self.warm, self.block = warm, block if block > 0 else BLOCK

    def loop_starts(self, t: float) -> None:
        """The training loop starts at ``t`` (this rank's clock): the origin of arrivals; readings restart."""
        self.origin = t + self.offset
        self.resume()

    def step_called(self, now: float) -> None:
        self._t_call = now

    def step_done(self, step: int, measured: bool, t_prev: float) -> None:
        """Step ``step`` (1-based, this run) ended; it began at ``t_prev``. One read of the training thread."""
        if self.main is None:
            return
        cpu, runq = self.main.delta()
        waits = self.meter.waits if self.comm_measured else ()
        new = waits[self._waits_seen:]
        self._waits_seen = len(waits)
        self._block_steps += 1
        if measured:
            self.runq_main.append(runq * 1e-9)
            self.cpu_main.append(cpu * 1e-9)
            self.runq_others.append(math.nan)
            self.cpu_others.append(math.nan)
            self.comm_wait.append(sum(new) if new else math.nan)
            self.arrival.append(self._arrival(t_prev) + self.offset)
            self.cpu_ns["main"] += cpu
            self.runq_ns["main"] += runq
            self._block_measured.append(len(self.runq_main) - 1)
        if step >= self.warm and (step - self.warm) % self.block == 0:
            self.close_block()

    def _arrival(self, t_prev: float) -> float:
        """When this step's last gradient was ready; without gradient hooks, when ``run.step()`` was called."""
        if self.meter is not None and self.meter.hooked and self.meter.last_gradient_s >= t_prev:
            return float(self.meter.last_gradient_s)
        return self._t_call if self._t_call >= t_prev else t_prev

    def close_block(self) -> None:
        """Read the other threads and spread their time evenly over the block's steps; rescan the thread list."""
        if self.main is None or self.others is None or not self._block_steps:
            return
        self.others.rescan()  # before reading: a thread born in this block is read whole
        per = self.others.read()
        n, measured = self._block_steps, self._block_measured
        if measured:
            cpu = sum(c for c, _ in per.values()) * 1e-9 / n
            runq = sum(r for _, r in per.values()) * 1e-9 / n
            for i in measured:
                self.cpu_others[i], self.runq_others[i] = cpu, runq
            share = len(measured) / n
            for cls, (c, r) in per.items():
                self.cpu_ns[cls] += c * share
                self.runq_ns[cls] += r * share
        self._block_steps, self._block_measured = 0, []

    def pause(self) -> None:
        """Work that is not step time starts (evaluation, a checkpoint): close the block."""
        self.close_block()

    def resume(self) -> None:
        """Step time resumes: what the threads did meanwhile is not counted."""
        if self.main is None or self.others is None:
            return
        self.main.delta()
        self.others.rescan()
        self.others.read()
        self._block_steps, self._block_measured = 0, []
        self._waits_seen = len(self.meter.waits) if self.comm_measured else 0
        self._t_call = time.perf_counter()

    def end(self) -> None:
        """After the last step, before the loader stops: the last block is read, descriptors closed."""
        self.close_block()
        if self.others is not None:
            self.others.close()
        if self.main is not None:
            self.main.close()
        self.main = None  # the thread set stays: its counts go into the report

    # ---- results
    def row(self, i: int) -> list[float]:
        """Columns 4-8 of measured step ``i``'s ``rank_steps`` row (arrival on rank 0's clock, not yet shifted)."""
        if i >= len(self.runq_main):
            return list(NAN_ROW)
        return [self.runq_main[i], self.runq_main[i] + self.runq_others[i], self.cpu_main[i] + self.cpu_others[i],
                self.comm_wait[i], self.arrival[i]]

    def report(self) -> dict[str, Any]:
        """This rank's part of the summary's ``accounting`` (``merge_accounting`` joins the ranks')."""
        n = len(self.runq_main)
        threads = dict(self.others.counts) if self.others is not None else dict.fromkeys(THREAD_CLASSES, 0)
        return {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "reason": self.reason,
                "offset": self.offset, "bound": self.bound, "origin": self.origin, **local_cpu_limits(),
                "threads": threads if self.reason is None else {},
                "cpu_s": {c: v * 1e-9 / n if n else math.nan for c, v in self.cpu_ns.items()},
                "runq_s": {c: v * 1e-9 / n if n else math.nan for c, v in self.runq_ns.items()}}
