"""Preemption: SIGTERM makes every rank stop at one agreed step boundary, checkpoint, and exit ``EXIT_PREEMPTED``.

The signal handler only sets a flag. At each step boundary the run reads that flag (no sync, no store
call while it is down). A rank that sees it posts, through the c10d store, the boundary where it first saw
it; when every rank has posted, the stop step is the largest post plus ``lead``. Every strategy with a
collective in each step keeps ranks within one step of each other, so no rank can have passed that
boundary when it learns it (the last rank to post does so before the next step's collective, which every
other rank needs to finish that step). Under local SGD the lead is one averaging period. A rank that never
received the signal learns of it from the store key the first rank set (through the watchdog's beat).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["Preemption", "EXIT_PREEMPTED"]

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the job stopped for a reason outside it; resume with --resume auto


class Preemption:
    """SIGTERM -> an agreed stop step across ranks (see the module docstring)."""

    def __init__(self, store: Any, rank: int, world: int, attempt: int = 0, lead: int = 1):
        self.store, self.rank, self.world, self.lead = store, rank, world, lead
        self.prefix = f"trainscale/{attempt}/preempt/"
        self.requested = False  # set by the handler (or by the watchdog from the store): a plain bool read per step
        self.stop_at: int | None = None
        self._posted = False
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.requested = True

    def uninstall(self) -> None:
        """Give SIGTERM back its previous handler."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def poll_store(self) -> None:
        """From another thread: learn of a request that reached another rank only."""
        if not self.requested and self.store is not None and self.store.check([self.prefix + "any"]):
            self.requested = True

    def should_stop(self, step: int) -> bool:
        """At a step boundary (``step`` steps done), once requested: whether to stop here."""
        if self.stop_at is None:
            self.stop_at = self._agree(step)
        return self.stop_at is not None and step >= self.stop_at

    def _agree(self, step: int) -> int | None:
        if self.world == 1 or self.store is None:
            return step
        if not self._posted:
            self._posted = True
            self.store.set(self.prefix + "any", "1")
            self.store.set(self.prefix + f"at/{self.rank}", str(step))
            self.store.add(self.prefix + "posted", 1)
        if self.store.add(self.prefix + "posted", 0) < self.world:  # not yet every rank: go on, ask again next step
            return None
        posts = self.store.multi_get([self.prefix + f"at/{r}" for r in range(self.world)])
        return max(int(p) for p in posts) + self.lead
