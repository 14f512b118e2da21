"""Per-rank time accounting, measured: where each rank's threads spent each step (``log.accounting``).

Per measured step, this rank records

- the run-queue wait of its training thread (runnable, not running: another process or thread had the CPU)
  and of the threads its step waits for (the training thread and the backend's: collectives, intra-op; the
  loader's and its workers' waits show as data wait instead), and the on-CPU time of all its threads and its
  workers' processes, from the kernel's schedstat (``schedstat.py``);
- the exposed communication wait of the step (``CommMeter``: from the last gradient to the end of the
  exchange; under FSDP, whose collectives run all through the step, the training thread's time neither
  running nor runnable outside its data wait; CPU only);
- when its last gradient became ready, on a clock common to all ranks (``clocks.py``): the rank that
  arrives last at the step's collective is the one the others waited for.

The training thread is read (one ``os.pread``) at the end of every step that ends ``READ_EVERY_S`` or more
after its last read, and at the end of each block; what it did since is spread evenly over the steps since, so
steps of 10 ms or more are read one by one. A read of schedstat costs about 1.5 us in a loop but 13-18 us of
the training thread's CPU when it falls between two steps (the kernel's work displaces the step's caches): read
every step, it cost 2-3% of a 1.2 ms step (``benchmarks/doctor_accounting.py``). The other threads are read
once per block of steps (a block of ``ablate.phases``, else ``BLOCK`` steps), their thread list rescanned every
``RESCAN`` blocks, a block's total likewise spread evenly over its steps. Spreading a rank's run-queue wait over
a few short steps leaves its sum as it was; what it can blur is which rank waited in which step, and on a saved
run of the memory-bandwidth case (50 ms steps) spreading over even 8 steps moved the measured CPU contention
from 39.1 to 38.0 ms per step.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import threading
import time
from typing import Any

from ...config import STEP_ROW
from .accounting_summary import local_cpu_limits
from .clocks import measure_offset
from .protocol import Instrument, StepEnd
from .schedstat import THREAD_CLASSES, ThreadSet, available, read_schedstat

__all__ = ["Accounting", "start_accounting", "BLOCK", "NAN_ROW", "READ_EVERY_S"]

BLOCK = 8  # steps per read of the other threads when no phase plan sets the block
READ_EVERY_S = 0.01  # the training thread is read at the first step end this long after its last read
RESCAN = 4  # blocks per rescan of the thread list
NAN_ROW = [math.nan] * (len(STEP_ROW) - 4)  # rank_steps columns 4-8 of a step without accounting
_RUNS = itertools.count()  # a key of the store per run of this process (a script may start several)


def start_accounting(rank: int, world: int, store: Any, meter: Any, device_type: str, attempt: int) -> Accounting:
    """Measure the clock offset to rank 0 (collective: every rank calls it) and open this rank's accounting."""
    key = f"trainscale/clock/{attempt}/{next(_RUNS)}"
    offset, bound = measure_offset(store, rank, world, key)
    return Accounting(rank, meter, device_type == "cpu", offset, bound)


class Accounting(Instrument):
    """This rank's per-step accounting; the instruments call ``step_called``, ``step_done`` and the block seams.

    The step's path is kept to one append and a clock read: per measured step a tuple (training thread's
    on-CPU ns, its run-queue ns, arrival on rank 0's clock, exposed communication wait), the first two filled in
    at the next read of the training thread; per block the other threads' share per step. Rows and the report
    are built from these at the end.
    """

    def __init__(self, rank: int, meter: Any, comm_measured: bool, offset: float, bound: float):
        self.rank, self.meter, self.offset, self.bound = rank, meter, offset, bound
        self.hooked = meter is not None and meter.hooked
        self.comm_measured = comm_measured and self.hooked
        self.comm_blocked = comm_measured and meter is not None and meter.blocked_is_exposed  # FSDP on CPU
        self.reason = available()
        self.warm, self.block = 0, BLOCK
        self.origin = math.nan  # the loop's start, on rank 0's clock
        self.others: ThreadSet | None = None
        self._fd: int | None = None
        if self.reason is None:
            tid = threading.get_native_id()  # the training thread: the one that builds the run
            self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            self.others = ThreadSet(tid)
            self.others.rescan()
        self._cpu, self._runq = self._read_main()
        self._t_read = time.perf_counter()
        self._unread = self._unread_measured = 0  # steps since the training thread's last read (all; measured)
        self._last_runq_s = math.nan
        self._steps: list[tuple[float, float, float, float]] = []  # per measured step: cpu ns, runq ns, arrival, comm
        self._others: list[tuple[float, float]] = []  # per measured step: the other threads' cpu, runq ns
        self.cpu_ns = dict.fromkeys(THREAD_CLASSES, 0.0)  # other classes, summed over measured steps
        self.runq_ns = dict.fromkeys(THREAD_CLASSES, 0.0)
        self._block_steps = self._block_measured = self._blocks = 0
        self._waits_seen = 0
        self._t_call = 0.0

    def _read_main(self) -> tuple[int, int]:
        return read_schedstat(self._fd) if self._fd is not None else (0, 0)

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
        """Step ``step`` (1-based, this run) ended; it began at ``t_prev``. The training thread is read when the
        block ends or ``READ_EVERY_S`` has passed since its last read."""
        if self._fd is None:
            return
        if measured:
            self._steps.append((0.0, 0.0, self._arrival(t_prev) + self.offset, self._comm_wait()))
            self._block_measured += 1
            self._unread_measured += 1
        self._unread += 1
        self._block_steps += 1
        if step >= self.warm and (step - self.warm) % self.block == 0:
            self.close_block()
        elif time.perf_counter() - self._t_read >= READ_EVERY_S:
            self._read_spread()

    def _read_spread(self) -> None:
        """Read the training thread; spread what it did since its last read evenly over the steps since."""
        cpu, runq = self._read_main()
        n, m = self._unread, self._unread_measured
        if n:
            c, r = (cpu - self._cpu) / n, (runq - self._runq) / n
            self._last_runq_s = r / 1e9
            for i in range(len(self._steps) - m, len(self._steps)):
                self._steps[i] = (c, r, *self._steps[i][2:])
        self._cpu, self._runq, self._t_read = cpu, runq, time.perf_counter()
        self._unread = self._unread_measured = 0

    def last_runq_s(self) -> float:
        """The training thread's run-queue wait per step at its last read (NaN before one)."""
        return self._last_runq_s

    def _arrival(self, t_prev: float) -> float:
        """When this step's last gradient was ready; without gradient hooks, when ``run.step()`` was called."""
        if self.hooked and self.meter.last_gradient_s >= t_prev:
            return float(self.meter.last_gradient_s)
        return self._t_call if self._t_call >= t_prev else t_prev

    def _comm_wait(self) -> float:
        """The exposed communication waits the meter noted since the previous step (NaN: none, or not on CPU)."""
        if not self.comm_measured:
            return math.nan
        waits = self.meter.waits
        new, self._waits_seen = waits[self._waits_seen:], len(waits)
        return sum(new) if new else math.nan

    def close_block(self) -> None:
        """Read the other threads and spread their time evenly over the block's steps.

        The thread list is rescanned every ``RESCAN`` blocks (a listing costs twice a block's reads): a thread
        or worker process started meanwhile is found then, and its time since it started counted in that block.
        """
        if self._fd is None or self.others is None or not self._block_steps:
            return
        self._read_spread()  # the training thread's steps of this block are all filled in
        if self._blocks % RESCAN == 0:
            self.others.rescan()  # before reading: a thread found now is read whole
        self._blocks += 1
        per = self.others.read()
        n, m = self._block_steps, self._block_measured
        if m:
            # CPU of every thread; run-queue wait only of the backend's (with the training thread's: runq_crit_s).
            share = (sum(c for c, _ in per.values()) / n, sum(r for cls, (_, r) in per.items() if cls == "backend") / n)
            self._others.extend([share] * m)
            for cls, (c, r) in per.items():
                self.cpu_ns[cls] += c * m / n
                self.runq_ns[cls] += r * m / n
        self._block_steps = self._block_measured = 0

    def pause(self) -> None:
        """Work that is not step time starts (evaluation, a checkpoint): close the block."""
        self.close_block()

    def resume(self) -> None:
        """Step time resumes: what the threads did meanwhile is not counted."""
        if self._fd is None or self.others is None:
            return
        if self._unread:
            self._read_spread()  # a block left open: its steps keep the training thread's time up to now
        self._others.extend([(math.nan, math.nan)] * self._block_measured)  # a block left open: no share
        self._cpu, self._runq = self._read_main()
        self._t_read = time.perf_counter()
        self._unread = self._unread_measured = 0
        self.others.rescan()
        self.others.read()
        self._block_steps = self._block_measured = 0
        self._blocks = 1  # just rescanned
        self._waits_seen = len(self.meter.waits) if self.comm_measured else 0
        self._t_call = time.perf_counter()

    def end(self) -> None:
        """After the last step, before the loader stops: the last block is read, descriptors closed."""
        self.close_block()
        if self.others is not None:
            self.others.close()  # the thread set stays: its counts go into the report
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None

    # ---- the instrument's hooks
    def on_loop_start(self, t: float) -> None:
        self.loop_starts(t)

    def on_step_called(self, t: float) -> None:
        self.step_called(t)

    def on_step_end(self, end: StepEnd) -> None:  # after the step's clock read: its reads are paid by the next step
        self.step_done(end.step, end.measured, end.t_start)

    def on_pause(self) -> None:
        self.pause()

    def on_resume(self) -> None:
        self.resume()

    def on_steps_end(self) -> None:
        self.end()

    # ---- results
    def row(self, i: int, step_s: float, wait_s: float) -> list[float]:
        """Columns 4-8 of measured step ``i``'s ``rank_steps`` row (arrival on rank 0's clock, not yet shifted);
        ``step_s`` and ``wait_s``: that step's time and data wait."""
        if i >= len(self._steps):
            return list(NAN_ROW)
        cpu, runq, arrival, comm = self._steps[i]
        if self.comm_blocked:  # neither running nor runnable, and not waiting for data: in a collective's wait
            comm = max(0.0, step_s - wait_s - (cpu + runq) * 1e-9)
        o_cpu, o_runq = self._others[i] if i < len(self._others) else (math.nan, math.nan)
        return [runq * 1e-9, (runq + o_runq) * 1e-9, (cpu + o_cpu) * 1e-9, comm, arrival]

    def report(self) -> dict[str, Any]:
        """This rank's part of the summary's ``accounting`` (``merge_accounting`` joins the ranks')."""
        n = len(self._steps)
        cpu_ns = {**self.cpu_ns, "main": float(sum(s[0] for s in self._steps))}
        runq_ns = {**self.runq_ns, "main": float(sum(s[1] for s in self._steps))}
        threads = dict(self.others.counts) if self.others is not None else {}
        return {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "reason": self.reason,
                "offset": self.offset, "bound": self.bound, "origin": self.origin, **local_cpu_limits(),
                "threads": threads,
                "cpu_s": {c: cpu_ns[c] * 1e-9 / n if n else math.nan for c in THREAD_CLASSES},
                "runq_s": {c: runq_ns[c] * 1e-9 / n if n else math.nan for c in THREAD_CLASSES}}
