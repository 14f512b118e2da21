"""Which rank is slow, since which step, by how much, and why: a pure detector over every rank's windows.

Each rank's score in a window is its own time per step, the time it did not spend waiting for the other ranks:
forward + backward (the compute clock stops when the backward graph is done, before DDP waits for its
all-reduces), data wait, and, with the time accounting on, its training thread's wait for a CPU (run-queue
wait, plus the time its CPU cgroup's quota throttled it). The all-reduce evens out wall time, so the step time
alone cannot tell who made the others wait; own time can. The wait for a CPU is in the score because a busy
neighbour on a rank's core delays the rank mostly outside its forward and backward: woken when the all-reduce
completes, its training thread waits for the core before it runs the optimizer and fetches the next batch
(``benchmarks/results/2026-11-27-neighbour-effect.md``). Part of that wait falls inside the compute clock too
and is counted twice, which over-weights contention on purpose.

Rank 0 scores each rank against the median of the others and runs a one-sided CUSUM per rank (Page, 1954) on
the log of that ratio: a rank whose ratio stays above the drift accumulates evidence, and once the sum passes
the threshold the rank is declared slow from the step where the sum left zero; the episode ends when the sum
falls back to zero. Drift and threshold are in units of the run's own noise, as a CUSUM's are: on a quiet
accelerator the ranks' ratios stay within a few percent, on a shared 2-core VM a 5-step window swings 0.5-1.9x
with no fault at all. The cause is the part of the excess, summed over the windows since the sum left zero,
that dominates: data wait (``data``), the wait for a CPU (``cpu_contention``), the rest of compute
(``compute``); ``unknown`` when none holds most of it.

How each setting below was chosen is recorded, with the command and the saved windows to replay it
(``benchmarks/straggler_replay.py``), in ``benchmarks/results/``:
``2026-11-26-straggler-noise.md`` (the drift, the noise scale, the warm-up windows),
``2026-11-27-straggler-own-time.md`` (own time as the score, the threshold),
``2026-11-27-straggler-gate-emulation.md`` (the gate and the wait CUSUM), and
``2026-11-28-fault-localisation-gate.md`` (all of them on 300 new injected runs and 100 clean ones).
"""

from __future__ import annotations

import collections
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Episode", "StragglerDetector", "Window", "DRIFT", "THRESHOLD", "GATE"]

# A rank is slow only above 1.4x the others' median, however quiet the run: one rank of a clean job on a shared
# CPU host runs 1.5-1.8x the other's time for several windows at a time.
DRIFT = math.log(1.4)
# The CUSUM sum of log-ratio excess that declares a rank slow (one window at 3.8x, two at 2.3x). The wait for a
# CPU in the score brings the host's scheduling noise with it; this threshold keeps clean runs quiet at the cost
# of naming a fault about half a window later.
THRESHOLD = 1.0
# Drift and threshold grow to these many robust standard deviations of the ranks' log-ratios (the textbook
# CUSUM's k = 0.5 sigma, h = 4-5 sigma), measured over the last NOISE_WINDOWS windows in which no rank was slow;
# NOISE_PRIOR stands in until MIN_NOISE values are in.
DRIFT_SIGMAS, THRESHOLD_SIGMAS = 0.5, 4.0
NOISE_WINDOWS, MIN_NOISE, NOISE_PRIOR = 32, 6, 0.15
DOMINANT = 0.5  # a cause is named when it holds more than this share of the rank's excess time
CALM = 2  # windows in a row under the drift (or with another cause) that end an episode
# Windows not scored at the start: ranks start unevenly (threads starting, first all-reduces, other work on the
# host), which is not a fault, and most false alarms of clean runs opened there.
WARMUP = 2
# A rank's wait for a CPU counts only when something besides the job's ranks took at least GATE cores of its
# host (outside processes, the ranks' loader workers) or its CPU quota held it back: ranks that share cores wait
# for one another in turn, which is placement, not a fault.
GATE = 0.25
# A second CUSUM per rank, on its wait for a CPU beyond the others' as a share of their own time: a neighbour
# pinned to one rank's core slows the other rank too (their Gloo threads share the other core), so the ratio of
# own times can stay near its drift while the rank waits for a CPU window after window.
WAIT_DRIFT, WAIT_THRESHOLD = 0.2, 1.0


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
        # not hold (a neighbour on a rank's core slows its in-thread loading too: that is not the data's fault).
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
    median own time ``base``; 0 unless every rank's wait was measured and gated (``GATE``: without it, ranks that
    share cores wait for one another in turn and this CUSUM would name them)."""
    if "cpu_contention" not in excess or not all(w.gated for w in windows):
        return 0.0
    return excess["cpu_contention"] / base if base > 0 else 0.0


def _contended(excess: list[dict[str, float]], ratios: list[float], k: float) -> bool:
    """Whether a rank above the drift owes most of its excess to waiting for a CPU (run-queue wait)."""
    return any(ratio > math.exp(k) and _dominant(ex) == "cpu_contention" for ex, ratio in zip(excess, ratios))


def _scores(windows: list[Window]) -> tuple[list[float], list[dict[str, float]], list[float]]:
    """Per rank: its own time over the others' median, its excess parts (``_excess``), its wait excess."""
    ratios, excess, waits = [], [], []
    for r, mine in enumerate(windows):
        others = windows[:r] + windows[r + 1:]
        base = statistics.median(w.own_s for w in others)
        ratios.append(mine.own_s / base if base > 0 and mine.own_s > 0 else 1.0)
        excess.append(_excess(mine, others))
        waits.append(_wait_excess(excess[-1], windows, base))
    return ratios, excess, waits


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
        ratios, excess, waits = _scores(windows)
        # Start-up windows are not scored but are noise to measure. A window with a slow rank is not noise, nor
        # one in which a rank is slower by its measured wait for a CPU: that is a cause (a neighbour's), and taken
        # for noise it would raise the threshold until it hid both itself and the next fault.
        calm = not any(self.active)
        if self.warmup > 0:
            self.warmup -= 1
            if not _contended(excess, ratios, self.drift):
                self.noise.extend(math.log(x) for x in ratios)
            return []
        # The noise scale matters only once a sum is above zero or a ratio passes the drift's floor: most windows
        # of a run skip its medians over the last NOISE_WINDOWS windows (most of the update's time).
        quiet = not any(self.sums) and not any(self.active) and max(ratios) <= math.exp(self.drift)
        sigma = 0.0 if quiet else self.sigma()
        k, h = max(self.drift, self.drift_sigmas * sigma), max(self.threshold, self.threshold_sigmas * sigma)
        calm = calm and not _contended(excess, ratios, k)
        opened: list[Episode] = []
        for r, mine in enumerate(windows):
            self.scores[r] = ratios[r]
            opened += self._advance(r, mine, ratios[r], excess[r], waits[r], k, h)
        self._learn_noise(ratios, calm, opened)
        return opened

    def _advance(self, r: int, mine: Window, ratio: float, excess: dict[str, float], wait: float, k: float,
                 h: float) -> list[Episode]:
        """Rank ``r``'s CUSUMs moved by its window; the episode this opens, or ends and opens anew."""
        first = mine.step - self.every + 1  # this window's first step
        before, self.sums[r] = self.sums[r], max(0.0, self.sums[r] + math.log(ratio) - k)
        if before == 0.0 and self.sums[r] > 0.0:
            self.rise[r], self.evidence[r] = first, {}
        before, self.waits[r] = self.waits[r], max(0.0, self.waits[r] + wait - WAIT_DRIFT)
        if before == 0.0 and self.waits[r] > 0.0:
            self.wait_rise[r] = first
        if self.sums[r] > 0.0:
            for name, v in excess.items():
                self.evidence[r][name] = self.evidence[r].get(name, 0.0) + v
        ep = self.active[r]
        if ep is None:
            # The cause of all the windows that made the evidence, not of the last alone: a neighbour on the core
            # shows first as wait for a CPU, and in one window may slow the in-thread input loading more.
            if self.sums[r] > h:
                return [self._open(r, mine, max(self.rise[r], 1), _dominant(self.evidence[r]), ratio)]
            if self.waits[r] > WAIT_THRESHOLD:
                return [self._open(r, mine, max(self.wait_rise[r], 1), "cpu_contention", ratio)]
            return []
        if self._got_worse(r, ep, ratio, first, k, h):
            ep.until_step, self.pending[r] = self.worse_rise[r] - 1, None
            return [self._open(r, mine, self.worse_rise[r], _dominant(excess), ratio)]
        cause = _dominant(excess) if ratio > math.exp(k) else "cpu_contention" if wait > WAIT_DRIFT else "calm"
        return self._follow(r, ep, mine, ratio, cause, first)

    def _follow(self, r: int, ep: Episode, mine: Window, ratio: float, cause: str, first: int) -> list[Episode]:
        """An open episode goes on with its cause, or ends after ``CALM`` windows of another (a new one opens)."""
        if cause == ep.cause:
            self.pending[r] = None
            ep.ratios.append(ratio)
            ep.slowdown = round(statistics.median(ep.ratios), 3)
            return []
        p = self.pending[r]
        p = self.pending[r] = (cause, p[1], p[2] + 1) if p is not None and p[0] == cause else (cause, first, 1)
        if p[2] < CALM:
            return []
        ep.until_step, self.active[r], self.pending[r] = p[1] - 1, None, None
        if cause == "calm":
            self.sums[r] = self.waits[r] = 0.0
            return []
        return [self._open(r, mine, p[1], cause, ratio)]

    def _learn_noise(self, ratios: list[float], calm: bool, opened: list[Episode]) -> None:
        """A calm window's log-ratios into the noise scale, once it is known not to be a fault's onset.

        While some rank's sum is above zero, a calm window is held back until every sum is back at zero (it was
        noise) or an episode opens (it was a fault's onset: taken for noise, it would raise the threshold past
        the fault). A sum that stays above zero for NOISE_WINDOWS windows without an episode is this run's noise
        after all.
        """
        if opened:
            self.held.clear()
        elif calm and not any(self.active):
            self.held.extend(math.log(x) for x in ratios)
            if not any(self.sums) or len(self.held) >= NOISE_WINDOWS * self.world:
                self.noise.extend(self.held)
                self.held.clear()

    def _got_worse(self, r: int, ep: Episode, ratio: float, first: int, k: float, h: float) -> bool:
        """Whether rank ``r``'s open episode has grown by more than the drift for long enough to be a new fault."""
        before = self.worse[r]
        self.worse[r] = max(0.0, before + math.log(ratio / statistics.median(ep.ratios)) - k)
        if before == 0.0 and self.worse[r] > 0.0:
            self.worse_rise[r] = first
        return self.worse[r] > h

    def _open(self, rank: int, w: Window, since: int, cause: str, ratio: float) -> Episode:
        ep = Episode(rank, w.host, w.pid, since, w.step, round(ratio, 3), cause, ratios=[ratio])
        self.worse[rank] = 0.0
        self.active[rank] = ep
        self.episodes.append(ep)
        return ep
