"""Live straggler detection: which rank became slow, since which step, by how much, and why (``log.stragglers``).

The signal is each rank's own time in a step, the time it did not spend waiting for the other ranks: its
forward + backward (the compute clock stops when the backward graph is done, before DDP waits for its
all-reduces), its data wait, and, with the time accounting on, its training thread's wait for a CPU (run-queue
wait). The all-reduce evens out wall time, so the step time alone cannot tell who made the others wait; this can.
The run-queue wait is there because a busy neighbour on a rank's core delays the rank mostly outside its
forward and backward: woken when the all-reduce completes, its training thread waits for the core before it
runs the optimizer and fetches the next batch (a rank pinned beside two busy processes: forward 1.43 -> 3.90
ms, whole step 7.28 -> 16.58 ms). Part of that wait also falls inside the compute clock and is counted twice;
that over-weights contention, which the compute clock and data wait alone named right in 2 of 11 injected
runs (a busy process or two on the rank's core). The time the rank's CPU cgroup was throttled by its quota is
added to that wait: a throttled rank's Gloo threads hold up every rank's all-reduce while its training thread
sleeps in it, where no run-queue wait of that thread shows (fault benchmark, seed 56: a rank held to 0.4 of a
core, the job 2.9x slower, not named without it).

The training thread only appends three numbers per measured step and, every ``log.straggler_every`` steps,
hands the window to a side thread, which pauses between wake-ups to keep its CPU under ``BUDGET`` of a core and
then takes every window sent meanwhile. On every other rank that thread publishes the windows' medians through
the c10d store (a connection of its own); on rank 0 it reads theirs of the same steps, scores each rank against
the median of the others, and runs a one-sided CUSUM per rank (Page, 1954) on the log of that ratio: a rank
whose ratio stays above the drift accumulates evidence, and once the sum passes the threshold the rank is
declared slow from the step where the sum left zero. The episode ends when the sum falls back to zero. Drift and
threshold are in units of the run's own noise, as a CUSUM's are (``noise``): on a quiet accelerator the ranks'
ratios stay within a few percent; on a shared 2-core VM a 5-step window swings 0.5-1.9x with no fault at all,
and a fixed threshold named a straggler in 18 of 47 clean runs of the fault benchmark. The
cause is the part of the excess, summed over the windows since the sum left zero, that dominates: data wait
(``data``), run-queue wait of the training thread when the time accounting is on (``cpu_contention``), the
rest of compute (``compute``); when none holds most of it, ``unknown``.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import queue
import socket
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ...log import logger
from .accounting_summary import cgroup_throttled, host_busy_s

__all__ = ["Episode", "StragglerDetector", "StragglerMonitor", "Window", "DRIFT", "THRESHOLD"]

# Ratios below 1.4x the other ranks' are not a straggler, however quiet the run: on a shared CPU host one rank of a
# clean job runs 1.5-1.8x the other's time for 5-6 windows at a time. Replayed on the windows of 47 clean and 39
# injected runs of the fault benchmark: a fixed 1.2x drift and 0.5 threshold gave 18 false alarms and 37 faults
# named; 1.4x with the noise scale below, 0 false alarms and 36 faults named.
# The threshold: the wait for a CPU in the score adds the host's scheduling noise (a clean 2-process job on 2 cores
# waits 1-2 ms a step for a CPU in a 4 ms step). Replayed on the windows of 24 clean and 24 injected runs, and 24 +
# 24 beside a nice'd busy loop (benchmarks/results/2026-11-27-straggler-own-time.md): 0.5 named 40 of the 48
# faults and raised 3 false alarms in the quiet clean runs; 1.0, 46 and 1 (the compute + data score before it,
# with 0.5: 39 and 1). The cost: detection about half a window later.
DRIFT = math.log(1.4)
THRESHOLD = 1.0  # CUSUM sum of log-ratio excess that declares a rank slow: one window at 3.8x, two at 2.3x
# The noise scale: drift and threshold grow to DRIFT_SIGMAS and THRESHOLD_SIGMAS robust standard deviations of the
# ranks' log-ratios (the textbook CUSUM's k = 0.5 sigma, h = 4-5 sigma), measured over the last NOISE_WINDOWS
# windows in which no rank was slow. Until MIN_NOISE values are in, NOISE_PRIOR stands in for the measurement.
DRIFT_SIGMAS, THRESHOLD_SIGMAS = 0.5, 4.0
NOISE_WINDOWS, MIN_NOISE, NOISE_PRIOR = 32, 6, 0.15
DOMINANT = 0.5  # a cause is named when it holds more than this share of the rank's excess time
CALM = 2  # windows in a row under the drift (or with another cause) that end an episode
RING = 128  # store slots per rank for its windows: rank 0 may lag this many windows behind
# Windows not scored at the start: ranks start unevenly (threads starting, first all-reduces, other work on the
# host), which is not a fault; in the fault benchmark's clean runs 13 of 18 false alarms opened in the first two.
WARMUP = 2
BUDGET = 0.0015  # the side thread's CPU, as a share of the wall time, that its pauses keep it under (``_pause``)
MAX_PAUSE_S = 0.5  # the longest pause: a warning or a score in metrics.jsonl comes at most about this late
# A rank's wait for a CPU counts only when something other than the job's ranks took CPU on its host (at least
# GATE cores: outside processes, the ranks' loader workers) or its CPU quota held it back. Ranks sharing cores
# with each other wait for one another in turn, which is placement, not a fault. Replayed on the fault
# benchmark's saved windows of seeds 51-57 (170 clean, 284 injected slow runs on a quiet host): false alarms
# 6 -> 1, right 276 -> 274 (two neighbours named only in their run's last window before lost).
GATE = 0.25
# A second CUSUM per rank, on its wait for a CPU (where it counts, ``GATE``) beyond the others', as a share of their
# own time: a neighbour pinned to a rank's core slows the other rank too (the ranks' Gloo threads share the other
# core), so the first CUSUM's ratio of own times can stay near its drift (1.2-1.7x) while the rank waits 2-4 ms
# a step more for a CPU than the other, window after window. Replayed on the saved windows of seeds 51-57 with the
# gate emulated: neighbours named 48 -> 55 of 56, quotas 55 -> 57 of 57, false alarms 1 of 170 as before (drift
# 0.3, threshold 1.5: 53 and 55; 0.4, 1.0: 52 and 57).
WAIT_DRIFT, WAIT_THRESHOLD = 0.2, 1.0
_RUNS = itertools.count()  # a key of the store per run of this process (a script may start several)


@dataclass
class Window:
    """One rank's medians over a window of steps ending at ``step``."""

    step: int
    compute_s: float
    wait_s: float
    runq_s: float  # the training thread's run-queue wait + its cgroup's quota throttling per step; NaN: no accounting
    host: str = ""
    pid: int = 0
    # Cores of the rank's host used by anything but the job's ranks (NaN: not measured, the wait counts as it is).
    other_cores: float = math.nan
    held: bool = False  # its CPU quota held it back: the wait counts whatever others used

    @property
    def gated(self) -> bool:
        """Whether the gate could judge this window: the cores others used were measured, or the quota held it."""
        return self.held or not math.isnan(self.other_cores)

    @property
    def cpu_wait_s(self) -> float:
        """The wait for a CPU that counts: none when only the job's own ranks used the host (``GATE``)."""
        return self.runq_s if self.held or not self.other_cores < GATE else 0.0

    @property
    def own_s(self) -> float:
        """The rank's own time per step: compute, data wait and (measured) wait for a CPU."""
        return self.compute_s + self.wait_s + (self.cpu_wait_s if math.isfinite(self.runq_s) else 0.0)


@dataclass
class Episode:
    """One rank slow from ``since_step`` (to ``until_step``, None while it lasts): the summary's ``stragglers``."""

    rank: int
    host: str
    pid: int
    since_step: int
    detected_at_step: int
    slowdown: float  # the rank's own time / the other ranks' median, median over the episode
    cause: str  # compute, data, cpu_contention or unknown
    until_step: int | None = None
    ratios: list[float] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["ratios"]
        return d

    def line(self) -> str:
        cause = "cause unknown" if self.cause == "unknown" else f"likely {self.cause.replace('_', ' ')}"
        return (f"straggler: rank {self.rank} ({self.host}, pid {self.pid}) slow since step {self.since_step}: "
                f"{self.slowdown:.2f}x the other ranks' own time ({cause})")


def _excess(mine: Window, others: list[Window]) -> dict[str, float]:
    """This rank's excess time per step over the others' median: data wait, wait for a CPU (as measured), the
    rest of compute and of the data wait (net of that wait)."""
    excess = {
        "data": mine.wait_s - statistics.median(w.wait_s for w in others),
        "compute": mine.compute_s - statistics.median(w.compute_s for w in others),
    }
    if math.isfinite(mine.runq_s) and all(math.isfinite(w.runq_s) for w in others):
        runq = excess["cpu_contention"] = mine.cpu_wait_s - statistics.median(w.cpu_wait_s for w in others)
        # The run-queue wait lies inside compute or, with a loader in the training thread, inside the data wait:
        # compute's excess is net of it (on-CPU work is what is left), then the data wait's of what compute did
        # not hold (a neighbour on a rank's core made its in-thread loading wait 4 ms a step more: not data).
        for part in ("compute", "data"):
            inside = min(max(runq, 0.0), max(excess[part], 0.0))
            excess[part] -= inside
            runq -= inside
    return excess


def _dominant(excess: dict[str, float]) -> str:
    """The part that holds most of the excess, or ``unknown`` when none does."""
    total = sum(max(v, 0.0) for v in excess.values())
    name, top = max(excess.items(), key=lambda kv: kv[1])
    return name if total > 0 and top > DOMINANT * total else "unknown"


def _wait_excess(excess: dict[str, float], windows: list[Window], base: float) -> float:
    """This rank's wait for a CPU beyond the others' median (``_excess``'s, before netting), as a share of their
    median own time ``base``; 0 unless every rank's wait was measured and gated (without the gate, ranks sharing
    cores wait for one another in turn: 26 false alarms in the 170 clean runs of that replay)."""
    if "cpu_contention" not in excess or not all(w.gated for w in windows):
        return 0.0
    return excess["cpu_contention"] / base if base > 0 else 0.0


def _contended(excess: list[dict[str, float]], ratios: list[float], k: float) -> bool:
    """Whether a rank above the drift owes most of its excess to waiting for a CPU (run-queue wait)."""
    return any(ratio > math.exp(k) and _dominant(ex) == "cpu_contention" for ex, ratio in zip(excess, ratios))


class StragglerDetector:
    """Pure: windows of every rank in, episodes out (one CUSUM per rank on log(time / the others' median)).

    An episode ends when the rank's ratio has stayed under ``exp(drift)`` for ``CALM`` windows; when its
    dominant cause changes for ``CALM`` windows, it ends and a new episode with the new cause begins. A rank that
    gets worse while slow (a second CUSUM, on its ratio over the episode's level) starts a new episode too, so a
    fault on a rank that was already a little slow is still named from its own onset. A third, on the rank's wait
    for a CPU beyond the others' (``WAIT_DRIFT``), names a rank a neighbour holds back even where the others are
    held back with it; while the wait stays above its drift the episode lasts.

    Example::

        det = StragglerDetector(world=2, every=5, warmup=0)
        det.update([Window(5, 0.010, 0.0, math.nan), Window(5, 0.031, 0.0, math.nan)])  # -> [Episode(rank=1, ...)]
    """

    def __init__(self, world: int, every: int, drift: float = DRIFT, threshold: float = THRESHOLD,
                 warmup: int = WARMUP, drift_sigmas: float = DRIFT_SIGMAS, threshold_sigmas: float = THRESHOLD_SIGMAS):
        self.world, self.every, self.drift, self.threshold, self.warmup = world, every, drift, threshold, warmup
        self.drift_sigmas, self.threshold_sigmas = drift_sigmas, threshold_sigmas
        self.noise: collections.deque[float] = collections.deque(maxlen=NOISE_WINDOWS * world)  # calm log-ratios
        self.held: list[float] = []  # log-ratios of calm windows while a rank's CUSUM sum is above zero
        self.sums = [0.0] * world
        self.rise = [0] * world  # the first step of the window where each rank's sum left zero
        # per rank: its excess (``_excess``) summed over the windows since its sum left zero, the cause it opens with
        self.evidence: list[dict[str, float]] = [{} for _ in range(world)]
        self.worse = [0.0] * world  # while an episode lasts: CUSUM of log(ratio / the episode's level)
        self.waits = [0.0] * world  # CUSUM of the wait for a CPU beyond the others' (``_wait_excess``)
        self.wait_rise = [0] * world
        self.worse_rise = [0] * world
        self.active: list[Episode | None] = [None] * world
        # per rank, while an episode lasts: (another cause or "calm", since which step, for how many windows)
        self.pending: list[tuple[str, int, int] | None] = [None] * world
        self.episodes: list[Episode] = []
        self.scores: list[float] = [1.0] * world  # the last window's ratios, for metrics.jsonl

    def sigma(self) -> float:
        """The ranks' log-ratio noise: 1.4826 x the median absolute deviation of the calm windows' log-ratios."""
        if len(self.noise) < MIN_NOISE:
            return NOISE_PRIOR
        mid = statistics.median(self.noise)
        return 1.4826 * statistics.median(abs(x - mid) for x in self.noise)

    def update(self, windows: list[Window]) -> list[Episode]:
        """Score one window of steps (one ``Window`` per rank, the same ``step``); return the episodes it opened."""
        ratios, excess, waits = [], [], []
        for r, mine in enumerate(windows):
            others = windows[:r] + windows[r + 1:]
            base = statistics.median(w.own_s for w in others)
            ratios.append(mine.own_s / base if base > 0 and mine.own_s > 0 else 1.0)
            excess.append(_excess(mine, others))
            waits.append(_wait_excess(excess[-1], windows, base))
        # Start-up windows are not scored but are noise to measure; a window with a slow rank is not, nor one in
        # which a rank is slower by its measured wait for a CPU: that is a cause (a neighbour's), and taken for
        # noise it would raise the threshold until it hid both itself and the next fault (beside a nice'd busy
        # loop, a rank at 1.9-2.8x for 25 steps, then a rank sleeping 4.6 ms a step at 2.0-2.8x: neither named).
        calm = not any(self.active)
        if self.warmup > 0:
            self.warmup -= 1
            if not _contended(excess, ratios, self.drift):
                self.noise.extend(math.log(x) for x in ratios)
            return []
        # The noise scale matters only once a sum is above zero or a ratio passes the drift's floor: most windows of
        # a run skip its medians over the last NOISE_WINDOWS windows (two thirds of the update's time).
        quiet = not any(self.sums) and not any(self.active) and max(ratios) <= math.exp(self.drift)
        sigma = 0.0 if quiet else self.sigma()
        k, h = max(self.drift, self.drift_sigmas * sigma), max(self.threshold, self.threshold_sigmas * sigma)
        calm = calm and not _contended(excess, ratios, k)
        opened = []
        for r, mine in enumerate(windows):
            ratio = self.scores[r] = ratios[r]
            first = mine.step - self.every + 1  # this window's first step
            before, self.sums[r] = self.sums[r], max(0.0, self.sums[r] + math.log(ratio) - k)
            if before == 0.0 and self.sums[r] > 0.0:
                self.rise[r], self.evidence[r] = first, {}
            before, self.waits[r] = self.waits[r], max(0.0, self.waits[r] + waits[r] - WAIT_DRIFT)
            if before == 0.0 and self.waits[r] > 0.0:
                self.wait_rise[r] = first
            if self.sums[r] > 0.0:
                for name, v in excess[r].items():
                    self.evidence[r][name] = self.evidence[r].get(name, 0.0) + v
            ep = self.active[r]
            if ep is None:
                # The cause of all the windows that made the evidence, not of the last alone: a neighbour on the
                # core shows first as wait for a CPU, and in one window may slow the in-thread input loading more.
                if self.sums[r] > h:
                    opened.append(self._open(r, mine, max(self.rise[r], 1), _dominant(self.evidence[r]), ratio))
                elif self.waits[r] > WAIT_THRESHOLD:
                    opened.append(self._open(r, mine, max(self.wait_rise[r], 1), "cpu_contention", ratio))
                continue
            if self._got_worse(r, ratio, first, k, h):
                ep.until_step, self.pending[r] = self.worse_rise[r] - 1, None
                opened.append(self._open(r, mine, self.worse_rise[r], _dominant(excess[r]), ratio))
                continue
            cause = (_dominant(excess[r]) if ratio > math.exp(k) else
                     "cpu_contention" if waits[r] > WAIT_DRIFT else "calm")
            if cause == ep.cause:
                self.pending[r] = None
                ep.ratios.append(ratio)
                ep.slowdown = round(statistics.median(ep.ratios), 3)
                continue
            p = self.pending[r]
            p = self.pending[r] = (cause, p[1], p[2] + 1) if p is not None and p[0] == cause else (cause, first, 1)
            if p[2] < CALM:
                continue
            ep.until_step, self.active[r], self.pending[r] = p[1] - 1, None, None
            if cause == "calm":
                self.sums[r] = self.waits[r] = 0.0
            else:
                opened.append(self._open(r, mine, p[1], cause, ratio))
        # A calm window while some rank's sum is above zero is held back from the noise until every sum is back
        # at zero (it was noise) or an episode opens (it was a fault's onset: taken for noise, it raised the
        # threshold past a rank sleeping 6 ms a step, 2.5-3.8x the other, never named in a replay). A sum that
        # stays above zero for NOISE_WINDOWS windows without an episode is this run's noise after all.
        if opened:
            self.held.clear()
        elif calm and not any(self.active):
            self.held.extend(math.log(x) for x in ratios)
            if not any(self.sums) or len(self.held) >= NOISE_WINDOWS * self.world:
                self.noise.extend(self.held)
                self.held.clear()
        return opened

    def _got_worse(self, r: int, ratio: float, first: int, k: float, h: float) -> bool:
        """Whether rank ``r``'s open episode has grown by more than the drift for long enough to be a new fault."""
        before = self.worse[r]
        level = statistics.median(self.active[r].ratios)  # type: ignore[union-attr]
        self.worse[r] = max(0.0, before + math.log(ratio / level) - k)
        if before == 0.0 and self.worse[r] > 0.0:
            self.worse_rise[r] = first
        return self.worse[r] > h

    def _open(self, rank: int, w: Window, since: int, cause: str, ratio: float) -> Episode:
        ep = Episode(rank, w.host, w.pid, since, w.step, round(ratio, 3), cause, ratios=[ratio])
        self.worse[rank] = 0.0
        self.active[rank] = ep
        self.episodes.append(ep)
        return ep


class StragglerMonitor:
    """This rank's side of the live monitor: windows to the store, and on rank 0 the detector (a side thread).

    Example::

        mon = StragglerMonitor(store, rank, world, every=10, prefix="trainscale/0/strag")
        mon.step(compute_s, wait_s, runq_s)   # training thread, each measured step: one append
        ...
        mon.close()                           # after the last step: the last windows scored, the thread joined
        mon.episodes()                        # rank 0: the stragglers found
    """

    def __init__(self, store: Any, rank: int, world: int, every: int, prefix: str):
        self.store, self.rank, self.world, self.every = store, rank, world, every
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
        hold other tasks' past): no seconds, but held when that cgroup's quota has held back anything (when the
        fault benchmark moved a rank under a quota at the onset, the cycle of the move showed 8-15 ms a step of
        wait for a CPU while the gate saw no quota: 7 of 10 such runs were named ``compute``).
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

    The cost is per wake-up, not per window (on a 2-core VM, 130-260 us of CPU a wake-up on a rank's side thread,
    most of it waking and taking the GIL from the busy training thread): on millisecond steps the thread scores
    several windows per wake-up, on steps of 100 ms and more it wakes for each window.
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
