"""The live straggler monitor (``log.stragglers``): every rank's windows to rank 0, scored while the job runs.

The training thread only appends three numbers per measured step and, every ``log.straggler_every`` steps,
hands the window to a side thread, which pauses between wake-ups to keep its CPU under ``BUDGET`` of a core and
then takes every window sent meanwhile. On every other rank that thread publishes the windows' medians through
the c10d store (a connection of its own); on rank 0 it reads theirs of the same steps and hands them to the
detector (``straggler_detector.py``: the score, the CUSUM and the cause). The time the rank's CPU cgroup was
throttled by its quota is added to the rank's wait for a CPU: a throttled rank's Gloo threads hold up every
rank's all-reduce while its training thread sleeps in it, where no run-queue wait of that thread shows
(``benchmarks/results/2026-11-27-fault-localisation-budget.md``). The side thread's cost is recorded in
``benchmarks/results/2026-11-27-straggler-monitor-cost.md``.
"""

from __future__ import annotations

import itertools
import math
import os
import queue
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from ...log import logger
from .accounting_summary import cgroup_throttled, host_busy_s
from .protocol import Instrument, StepEnd
from .straggler_detector import StragglerDetector, Window

__all__ = ["StragglerMonitor", "RING", "BUDGET"]

RING = 128  # store slots per rank for its windows: rank 0 may lag this many windows behind
BUDGET = 0.0015  # the side thread's CPU, as a share of the wall time, that its pauses keep it under (``_pause``)
MAX_PAUSE_S = 0.5  # the longest pause: a warning or a score in metrics.jsonl comes at most about this late
_RUNS = itertools.count()  # a key of the store per run of this process (a script may start several)


class StragglerMonitor(Instrument):
    """This rank's side of the live monitor: windows to the store, and on rank 0 the detector (a side thread).

    ``runq``: this rank's last measured step's wait for a CPU (the time accounting's), when it is on.

    Example::

        mon = StragglerMonitor(store, rank, world, every=10, prefix="trainscale/0/strag")
        mon.step(step, compute_s, wait_s, runq_s)   # training thread, each measured step: one append
        ...
        mon.close()                                 # after the last step: the last windows scored, thread joined
        mon.episodes()                              # rank 0: the stragglers found
    """

    def __init__(self, store: Any, rank: int, world: int, every: int, prefix: str,
                 runq: Callable[[], float] | None = None):
        self.store, self.rank, self.world, self.every = store, rank, world, every
        self._runq = runq
        self.prefix = f"{prefix}/{next(_RUNS)}"
        self.detector = StragglerDetector(world, every) if rank == 0 else None
        self._rows: list[tuple[Any, float, float]] = []
        self._pending: list[tuple[int, list[float]]] = []  # rank 0: its own windows (last step, medians) to score
        self._ids: list[tuple[str, int]] = []  # rank 0: every rank's (host, pid), read once
        self._queue: queue.SimpleQueue[tuple[int, list[tuple[Any, float, float]]] | None] = queue.SimpleQueue()
        self._failed = False
        self._closing = threading.Event()  # cuts the side thread's pause short at the end of the run
        self._tid = threading.get_native_id()  # the training thread (the one that builds the run)
        self._throttled = cgroup_throttled(self._tid)  # (its CPU cgroup, seconds throttled) at the last read
        self._cpu = _cpu_mark()  # (wall, the host's busy CPU, this process's CPU) at the last read
        # Before the run's first collective (prepare's), so that every rank's keys exist when rank 0 reads them.
        store.set(f"{self.prefix}/id/{rank}", f"{socket.gethostname()} {os.getpid()}")
        for slot in range(RING if rank > 0 else 0):  # rank 0 keeps its own windows: it is the one that reads
            store.set(self._key(rank, slot), "-1")
        self._thread = threading.Thread(target=self._run, name="trainscale-stragglers", daemon=True)
        self._thread.start()

    # ---- the instrument's hooks
    def on_step_end(self, end: StepEnd) -> None:  # after the accounting's read: this step's run-queue wait
        if end.measured:
            self.step(end.step, end.compute, end.wait_s, self._runq() if self._runq else math.nan)

    def on_steps_end(self) -> None:
        self.close()  # its thread ends here, before any group does

    def on_abandon(self) -> None:
        self.close(score=False)  # out of the store before the groups end

    def summary(self) -> dict[str, Any]:
        return {"stragglers": self.episodes()}

    # ---- training thread
    def step(self, step: int, compute: Any, wait_s: float, runq_s: float) -> None:
        """Measured step ``step``'s time before the collective (compute and data wait) and run-queue wait.

        ``compute``: seconds, or on CUDA the step's (start, end) events, which the side thread reads.
        """
        self._rows.append((compute, wait_s, runq_s))
        if len(self._rows) == self.every:  # every rank measures the same steps: the windows line up
            self._queue.put((step, self._rows))
            self._rows = []

    def close(self, score: bool = True) -> None:
        """No more steps: score what every rank published (``score``) and join the side thread (before the group
        ends: a thread inside a store call at interpreter exit can abort the process)."""
        if not self._thread.is_alive():
            return
        if not score:
            self._failed = True  # publish and score nothing more: a rank may be gone
        self._queue.put(None)
        self._closing.set()
        self._thread.join(timeout=30)

    def episodes(self) -> list[dict[str, Any]]:
        """The detected episodes (rank 0; empty elsewhere)."""
        return [e.as_dict() for e in self.detector.episodes] if self.detector else []

    def scores(self) -> list[float] | None:
        """Each rank's last scored ratio to the others' median (rank 0), for metrics.jsonl."""
        return [round(s, 3) for s in self.detector.scores] if self.detector else None

    # ---- side thread
    def _key(self, rank: int, slot: int) -> str:
        return f"{self.prefix}/{rank}/{slot}"

    def _run(self) -> None:
        done, cpu, start = False, time.thread_time(), time.monotonic()
        while not done and (item := self._queue.get()) is not None:
            start, last_start = time.monotonic(), start
            items = [item]
            while True:  # every window handed over while the thread slept: one store call for all of them
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    done = True
                    break
                items.append(nxt)
            if self._failed:
                continue
            try:
                windows = [(step, [statistics.median(col) for col in zip(*[(_seconds(c), w, q) for c, w, q in rows])])
                           for step, rows in items]
                throttled, held = self._throttled_since()
                busy, mine = self._cores_since()
                for _, med in windows:  # a CPU quota's hold on the rank counts as its wait for a CPU
                    med[2] += throttled / (len(windows) * self.every)
                    med += [float(held), busy, mine]
                if self.detector is None:
                    self._publish(windows)
                else:
                    self._pending.extend(windows)
                    self._score(wait_s=0.0)
            except Exception as e:  # the monitor must never end a training run
                self._failed = True
                logger.warning(f"straggler monitor off: {type(e).__name__}: {e}")
            if not done:  # the CPU since the last pause, its wake-up included, against this cycle's wall time
                cpu, before_cpu = time.thread_time(), cpu
                self._closing.wait(_pause(cpu - before_cpu, time.monotonic() - start, (start - last_start) / len(items)))
        if self.detector is not None and not self._failed:
            try:  # the others' last windows are a few steps behind at most; a rank that died never sends its own
                self._score(wait_s=5.0)
            except Exception as e:
                logger.debug(f"straggler monitor: the last windows were not scored: {e}")

    def _throttled_since(self) -> tuple[float, bool]:
        """Seconds this rank's CPU cgroup held it back by its quota since the last read, and whether a quota held it.

        A rank moved into another cgroup since the last read has no count to subtract (the new cgroup's counts
        hold other tasks' past): no seconds, but held when that cgroup's quota has held back anything; otherwise the
        cycle of the move shows a long wait for a CPU that the gate does not count, and the fault is named
        ``compute`` (``benchmarks/results/2026-11-28-fault-localisation-gate.md``).
        """
        last, self._throttled = self._throttled, cgroup_throttled(self._tid)
        if last is None or self._throttled is None:
            return 0.0, False
        if last[0] != self._throttled[0]:
            return 0.0, self._throttled[1] > 0
        seconds = self._throttled[1] - last[1]
        return seconds, seconds > 0

    def _cores_since(self) -> tuple[float, float]:
        """Cores the host was busy and cores this process used since the last read (NaN where unknown)."""
        last, self._cpu = self._cpu, _cpu_mark()
        wall = self._cpu[0] - last[0]
        return ((self._cpu[1] - last[1]) / wall, (self._cpu[2] - last[2]) / wall) if wall > 0 else (math.nan, math.nan)

    def _publish(self, windows: list[tuple[int, list[float]]]) -> None:
        """One store write for the windows, ``"step compute wait runq throttled host_busy own"`` (the last three
        over the side thread's cycle, in cores), into the rank's ring of ``RING`` slots."""
        keys = [self._key(self.rank, (step // self.every) % RING) for step, _ in windows]
        self.store.multi_set(keys, [" ".join(map(repr, [step, *med])) for step, med in windows])

    def _score(self, wait_s: float) -> None:
        """Rank 0: score its windows, oldest first, once every other rank has published the same steps (one read
        of their slots for all the pending windows; a window a lagging rank 0 lost to the ring is skipped)."""
        assert self.detector is not None
        if not self._ids:
            ids = self.store.multi_get([f"{self.prefix}/id/{r}" for r in range(self.world)])
            self._ids = [(h, int(p)) for h, p in (v.decode().split() for v in ids)]
        deadline = time.monotonic() + wait_s
        others = self.world - 1
        while self._pending:
            keys = [self._key(r, (step // self.every) % RING) for step, _ in self._pending for r in range(1, self.world)]
            values = [[float(x) for x in v.decode().split()] for v in self.store.multi_get(keys)]
            while self._pending:
                (step, own), theirs = self._pending[0], values[:others]
                if any(v[0] < step for v in theirs):  # not every rank is there yet
                    break
                self._pending.pop(0)
                del values[:others]
                if any(v[0] > step for v in theirs):
                    continue
                rows = [own] + [v[1:] for v in theirs]
                other = _other_cores([h for h, _ in self._ids], [(busy, mine) for *_, busy, mine in rows])
                windows = [Window(step, c, w, q, *self._ids[r], other_cores=other[r], held=bool(held))
                           for r, (c, w, q, held, *_) in enumerate(rows)]
                for ep in self.detector.update(windows):
                    logger.warning(ep.line())
            if not self._pending or time.monotonic() >= deadline:
                return
            time.sleep(0.01)


def _cpu_mark() -> tuple[float, float, float]:
    return time.monotonic(), host_busy_s(), time.process_time()


def _other_cores(hosts: list[str], cores: list[tuple[float, float]]) -> list[float]:
    """Per rank: the cores its host was busy with anything but the job's ranks on it (loader workers, other
    processes), from each rank's (host busy, own) cores over its last cycle."""
    by: dict[str, list[tuple[float, float]]] = {}
    for h, c in zip(hosts, cores):
        by.setdefault(h, []).append(c)
    other = {h: statistics.median(b for b, _ in cs) - sum(m for _, m in cs) for h, cs in by.items()}
    return [other[h] for h in hosts]


def _pause(cpu_s: float, wall_s: float, window_s: float) -> float:
    """Seconds the side thread sleeps after a cycle that took ``cpu_s`` of its CPU and ``wall_s``: long enough to
    keep its CPU under ``BUDGET`` of the wall time, at most ``MAX_PAUSE_S`` and the time of ``RING // 4`` windows
    of ``window_s`` each (rank 0 must read a window before its ring slot is written again).

    The cost is per wake-up, not per window (most of it waking and taking the GIL from the busy training thread):
    on millisecond steps the thread scores several windows per wake-up, on steps of 100 ms and more it wakes for
    each window.
    """
    return min(MAX_PAUSE_S, RING // 4 * window_s, max(0.0, cpu_s / BUDGET - wall_s))


def _seconds(compute: Any) -> float:
    """A step's compute seconds: a number, or CUDA (start, end) event pairs (read here, off the training thread)."""
    if isinstance(compute, (int, float)):
        return float(compute)
    total = 0.0
    for start, end in compute:
        end.synchronize()
        total += start.elapsed_time(end) / 1000.0
    return total
