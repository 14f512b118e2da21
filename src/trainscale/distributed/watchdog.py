"""Hang detection: every rank beats through the c10d store; a job without progress ends with the culprit named.

Each rank's thread publishes, every ``job.heartbeat_s``, a beat counter, the step, the phase of the step
(``data``, ``compute``, ``checkpoint`` ...) and a progress counter that the main thread bumps at each
phase change (plain attribute writes: the step gains no sync). When no rank has made progress for
``job.timeout_s``, every live rank reaches the same verdict from the store: the rank whose beats
stopped (SIGSTOP, a native deadlock that holds the GIL) or, failing that, the rank furthest behind (stuck in
I/O while the others wait in the step's collective). The first verdict is stored with ``compare_set``,
printed, recorded in torchrun's error file, the culprit is sent SIGKILL when it lives on this host (a
stopped process obeys no other signal, and torchrun would first wait its 30 s shutdown timeout), and the
rank exits with ``EXIT_HUNG``. PyTorch's own collective timeout stays armed behind it as the backstop.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from .hangs import code_position, describe, mismatch, newest_collective

__all__ = ["Watchdog", "RankHung", "EXIT_HUNG", "PHASES", "verdict", "Beat", "backstop_timeout_s", "raw_store"]

EXIT_HUNG = 3  # a rank ended because the job stopped making progress
PHASES = {"start": 0, "data": 1, "compute": 2, "checkpoint": 3, "evaluate": 4, "finish": 5}  # order within a step


class RankHung(RuntimeError):
    """The job stopped making progress; the message names the rank that stopped."""


def backstop_timeout_s(timeout_s: float, heartbeat_s: float) -> float:
    """PyTorch's collective timeout under the watchdog: late enough that the watchdog, which names the rank, acts first."""
    return timeout_s + (max(5.0, 3 * heartbeat_s) if heartbeat_s > 0 else 0.0)


def raw_store(store: Any) -> Any:
    """The store under torchrun's per-attempt prefixes (keys there outlive a restart)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


@dataclass
class Beat:
    """One rank's last published state."""

    rank: int
    beat: int
    step: int
    phase: str
    progress: int
    pid: int
    host: str
    detail: str = ""
    coll: dict[str, Any] | None = None  # the newest collective it entered (published once it stalls)
    at: str = ""  # where its main thread stands in the code (published once it stalls)

    @property
    def position(self) -> tuple[int, int]:
        return self.step, PHASES.get(self.phase, 9)

    def where(self) -> str:
        return f"step {self.step + (1 if self.phase in ('data', 'compute') else 0)} ({self.phase}" + \
            (f": {self.detail})" if self.detail else ")")

    def inside(self) -> str:
        """``, last collective #12 all_reduce [[1290]], at train.py:57 in main`` (empty when not published).

        The last collective it entered: for a rank that waits in one, the one it waits in.
        """
        coll = f", last {describe(self.coll)}" if self.coll else ""
        return coll + (f", at {self.at}" if self.at else "")


def verdict(beats: list[Beat], silent: set[int], stalled_s: float, timeout_s: float) -> tuple[list[int], str]:
    """Pure: which ranks stopped the job, and the one line that says so (ranks whose beats stopped come first)."""
    if silent:
        culprits = sorted(silent)
        how = "its heartbeat stopped (stopped or frozen process)"
    else:
        low = min(b.position for b in beats)
        culprits = [b.rank for b in beats if b.position == low]
        how = "it is behind the others" if len(culprits) < len(beats) else "no rank is ahead of it"
    by_rank = {b.rank: b for b in beats}
    names = ", ".join(f"{r} (pid {by_rank[r].pid} on {by_rank[r].host}, last seen in {by_rank[r].where()}"
                      f"{by_rank[r].inside()})" for r in culprits)
    waiting = [b for b in beats if b.rank not in culprits]
    waited = "; ".join(f"rank {b.rank} waited in {b.where()}{b.inside()}" for b in waiting) or "no other rank"
    plural = "s" if len(culprits) > 1 else ""
    line = (f"rank{plural} {names} stopped making progress: {how}; {waited}; no progress for {stalled_s:.0f} s "
            f"(job.timeout_s = {timeout_s:g})")
    odd = mismatch({b.rank: b.coll for b in beats})
    return culprits, f"{odd}; {line}" if odd else line


class Watchdog:
    """This rank's heartbeat thread and hang verdict; ``mark`` is the main thread's only (cheap) duty."""

    def __init__(self, store: Any, rank: int, world: int, timeout_s: float, beat_s: float, attempt: int = 0):
        self.store, self.rank, self.world = store, rank, world
        self.timeout_s, self.beat_s = timeout_s, beat_s
        self.prefix = f"trainscale/{attempt}/"
        self.step, self.phase, self.detail = 0, "start", ""
        self.progress = 0
        self._beat = 0
        self._published_progress = -1  # the progress counter at the previous beat: unchanged means stalled
        self._host, self._pid = socket.gethostname(), os.getpid()
        self._seen: dict[int, tuple[int, int, float, float]] = {}  # rank -> (beat, progress, beat at, progress at)
        self.on_beat: Any = None  # called from the thread after each beat (the preemption's store poll)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.publish()  # before any collective: every rank's key exists once the first one completes

    def mark(self, phase: str, step: int, detail: str = "") -> None:
        """The main thread moved on (no sync: three attribute writes)."""
        self.phase, self.step, self.detail = phase, step, detail
        self.progress += 1

    def start(self) -> Watchdog:
        """Beat and watch in a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="trainscale-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating and wait for the thread (the run is over or tearing down).

        The wait matters: a daemon thread still inside a store call when the interpreter finalizes is ended
        by ``pthread_exit`` as it takes the GIL back, which aborts the rank ("terminate called without an
        active exception") after its work was done.
        """
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, 2 * self.beat_s))

    def publish(self) -> None:
        """Write this rank's beat; once it made no progress since the last one, with its collective and code."""
        self._beat += 1
        beat = {"beat": self._beat, "step": self.step, "phase": self.phase, "progress": self.progress,
                "pid": self._pid, "host": self._host, "detail": self.detail}
        if self.progress == self._published_progress:  # stalled for a beat: worth the recorder's dump
            beat.update(coll=newest_collective(), at=code_position())
        self._published_progress = self.progress
        self.store.set(self.prefix + f"hb/{self.rank}", json.dumps(beat))

    def _loop(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self.publish()
                if self.on_beat is not None:
                    self.on_beat()
                self._check()
            except SystemExit:
                raise
            except Exception:  # the store is gone: the job is ending, torchrun's own timeouts take over
                if self._stop.is_set():
                    return
                time.sleep(self.beat_s)

    def _read(self) -> list[Beat]:
        keys = [self.prefix + f"hb/{r}" for r in range(self.world)]
        if not self.store.check(keys):
            return []
        return [Beat(rank=r, **{k: v for k, v in json.loads(raw).items()})
                for r, raw in enumerate(self.store.multi_get(keys))]

    def _check(self) -> None:
        key = self.prefix + "verdict"
        if self.store.check([key]):  # another rank has judged: end here too, with its words
            self._end(self.store.get(key).decode(), [])
        beats = self._read()
        if not beats:
            return
        now = time.monotonic()
        for b in beats:
            old = self._seen.get(b.rank)
            if old is None:
                self._seen[b.rank] = (b.beat, b.progress, now, now)
            else:
                self._seen[b.rank] = (b.beat, b.progress, now if b.beat != old[0] else old[2],
                                      now if b.progress != old[1] else old[3])
        stalled = now - max(s[3] for s in self._seen.values())
        if stalled < self.timeout_s or self._stop.is_set():
            return
        silent = {r for r, s in self._seen.items() if now - s[2] > max(3 * self.beat_s, 2.0)}
        culprits, line = verdict(beats, silent, stalled, self.timeout_s)
        line = self.store.compare_set(key, "", line).decode()  # the first verdict wins: one name for the job
        by_rank = {b.rank: b for b in beats}
        self._end(line, [by_rank[r] for r in culprits])

    def _end(self, line: str, culprits: list[Beat]) -> None:
        for b in culprits:
            if b.rank != self.rank and b.host == self._host:
                try:
                    os.kill(b.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        print(f"trainscale: {line}", file=sys.stderr, flush=True)
        try:
            from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
            ErrorHandler().record_exception(RankHung(line))  # what torchrun and trainscale's launcher report
        except Exception:
            pass
        os._exit(EXIT_HUNG)  # the main thread sits in a collective that only a timeout would end
