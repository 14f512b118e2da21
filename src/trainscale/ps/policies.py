"""Synchronisation policies of a parameter server as pure state machines (no Ray, no clocks).

A policy is told what happens (a learner's gradient arrived, a learner was lost, a learner came back)
and answers with what to do, in order: ``Apply`` an update made of some gradients, ``Cancel`` unfinished
work, ``Launch`` a learner on the current parameters. The Ray coordinator executes the actions; the unit
tests script the arrivals. Definitions follow Dutta et al. (AISTATS 2018):

===============  ===========  ====================  =============================================
mode             waits for    at the update         a learner that has pushed
===============  ===========  ====================  =============================================
sync             P learners   (nothing is left)     idles until the update
k-sync           K learners   cancels the rest      idles until the update
k-batch-sync     K batches    cancels the rest      starts its next batch at once, same parameters
async            1 learner    cancels nothing       restarts on the new parameters
k-async          K learners   cancels nothing       idles until the update
k-batch-async    K batches    cancels nothing       starts its next batch at once, current params
===============  ===========  ====================  =============================================

Every learner that is launched after an update starts from the new version; unfinished work that is not
cancelled finishes later and is applied with staleness ``version_now - version_computed_on``.

Example::

    p = Policy("k-sync", learners=3, k=2)
    p.start()                       # [Launch(0, 0, t0), Launch(1, 0, t1), Launch(2, 0, t2)]
    p.arrive(t1); p.arrive(t0)      # second call: [Apply(...), Cancel(2, t2), Launch(0..2, 1, ...)]
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["COORDINATED_MODES", "MODES", "Launch", "Cancel", "Apply", "Gradient", "Action", "Policy", "resolve_k"]

COORDINATED_MODES = ("sync", "k-sync", "k-batch-sync", "async", "k-async", "k-batch-async")
MODES = COORDINATED_MODES + ("downpour",)


@dataclass(frozen=True)
class Launch:
    """Start a mini-batch on ``learner`` with the parameters of ``version``; ``ticket`` names this work."""

    learner: int
    version: int
    ticket: int


@dataclass(frozen=True)
class Cancel:
    """Abandon the unfinished work ``ticket`` of ``learner``."""

    learner: int
    ticket: int


@dataclass(frozen=True)
class Gradient:
    """A pushed gradient: who computed it, on which version, under which ticket."""

    learner: int
    version: int
    ticket: int


@dataclass(frozen=True)
class Apply:
    """Update the parameters from version ``version - 1`` to ``version`` with the average of ``grads``."""

    version: int
    grads: tuple[Gradient, ...]
    staleness: tuple[int, ...]


Action = Launch | Cancel | Apply


def resolve_k(mode: str, learners: int, k: int | str) -> int:
    """K as the policy uses it: P for sync, 1 for async, ``k`` (or P // 2 for "auto") for the k-modes."""
    if mode == "sync":
        return learners
    if mode == "async":
        return 1
    if mode == "downpour":
        return 0
    return max(1, learners // 2) if k == "auto" else int(k)


@dataclass
class _Work:
    learner: int
    version: int


@dataclass
class Policy:
    """One of the coordinated modes for ``learners`` learners; ``k`` as in :func:`resolve_k`."""

    mode: str
    learners: int
    k: int | str = "auto"
    version: int = 0
    busy: dict[int, _Work] = field(default_factory=dict)  # ticket -> work in flight
    buffer: list[Gradient] = field(default_factory=list)  # pushed, not yet applied
    alive: set[int] = field(default_factory=set)
    _next_ticket: int = 0

    def __post_init__(self) -> None:
        if self.mode not in COORDINATED_MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(COORDINATED_MODES)}")
        self.k = resolve_k(self.mode, self.learners, self.k)
        if not 1 <= self.k <= self.learners:
            raise ValueError(f"K = {self.k} must be between 1 and P = {self.learners}")
        self.alive = set(range(self.learners))
        self.by_batch = self.mode.startswith("k-batch")
        self.cancels = self.mode in ("sync", "k-sync", "k-batch-sync")

    # ------------------------------------------------------------------------------------------ events

    def start(self) -> list[Action]:
        """Launch every learner on version 0."""
        return [self._launch(i) for i in sorted(self.alive)]

    def arrive(self, ticket: int) -> list[Action]:
        """The gradient of ``ticket`` was pushed; unknown tickets (cancelled or lost work) are ignored."""
        work = self.busy.pop(ticket, None)
        if work is None:
            return []
        self.buffer.append(Gradient(work.learner, work.version, ticket))
        if len(self.buffer) >= self._k:
            return self._update()
        if self.by_batch:
            # K-batch: the learner keeps going at once, on the parameters the server has now.
            return [self._launch(work.learner)]
        return []

    def lost(self, learner: int) -> list[Action]:
        """``learner`` died or its work failed: its unfinished work is dropped, never taken as a gradient.

        It is launched on nothing until :meth:`rejoin` (work sent to an actor that Ray is restarting would
        only fail again); the number of gradients an update waits for does not change.
        """
        for ticket in [t for t, w in self.busy.items() if w.learner == learner]:
            del self.busy[ticket]
        self.alive.discard(learner)
        return []

    def rejoin(self, learner: int) -> list[Action]:
        """``learner`` is back (restarted): it starts on the current parameters unless it waits for the update."""
        self.alive.add(learner)
        if any(w.learner == learner for w in self.busy.values()):
            return []
        if not self.by_batch and any(g.learner == learner for g in self.buffer):
            return []  # its gradient for this round is already in; it restarts at the update
        return [self._launch(learner)]

    def remove(self, learner: int) -> list[Action]:
        """``learner`` is gone for good; sync then waits for the learners that are left."""
        self.lost(learner)
        self.alive.discard(learner)
        if self.mode == "sync":
            self.k = max(1, len(self.alive))
        if self._k > len(self.alive) and not self.by_batch:
            raise RuntimeError(f"mode {self.mode} needs K = {self.k} learners but only {len(self.alive)} are left")
        if not self.alive:
            raise RuntimeError("no learner is left")
        if len(self.buffer) >= self._k:
            return self._update()
        return []

    # ------------------------------------------------------------------------------------------ helpers

    @property
    def _k(self) -> int:
        """K as a number: ``__post_init__`` resolves "auto"."""
        assert isinstance(self.k, int)
        return self.k

    def oldest_version(self) -> int:
        """The oldest version any pending or unfinished gradient was computed on (history to keep)."""
        versions = [w.version for w in self.busy.values()] + [g.version for g in self.buffer]
        return min(versions, default=self.version)

    def _launch(self, learner: int) -> Launch:
        ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
        self.busy[ticket] = _Work(learner, self.version)
        return Launch(learner, self.version, ticket)

    def _update(self) -> list[Action]:
        grads, self.buffer = tuple(self.buffer[: self._k]), self.buffer[self._k:]
        staleness = tuple(self.version - g.version for g in grads)
        self.version += 1
        actions: list[Action] = [Apply(self.version, grads, staleness)]
        if self.cancels:
            for ticket, work in sorted(self.busy.items()):
                actions.append(Cancel(work.learner, ticket))
            self.busy.clear()
            idle = sorted(self.alive)
        else:
            working = {w.learner for w in self.busy.values()}
            # In K-batch-async only the learner whose push triggered the update is free; it starts on the
            # new parameters. In K-async the K learners that pushed wait for exactly this moment.
            waiting = set() if self.by_batch else {g.learner for g in self.buffer}
            idle = sorted(self.alive - working - waiting)
        actions += [self._launch(i) for i in idle]
        return actions
