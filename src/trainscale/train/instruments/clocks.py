"""One clock for all ranks: each rank's offset to rank 0's ``time.perf_counter``, measured once at start.

A rank sends a ping through the job's store at ``t1`` (its own clock); rank 0 answers with its own clock
reading ``ts``; the answer arrives at ``t2``. Rank 0 read ``ts`` at some instant between ``t1`` and ``t2``,
so the offset (rank 0's clock minus this rank's) lies in ``[ts - t2, ts - t1]``: the midpoint is off by at
most half the round trip, whatever the delays of the two legs. Of a few rounds the shortest round trip
gives the tightest bound (NTP's clock filter, RFC 5905 section 10). Through a TCPStore on the 2-core
development VM the shortest of 10 round trips is 160-250 us, but several milliseconds while the cores are
oversubscribed, so a bound of a few ms is possible there.

A rank that shares rank 0's clock is not measured: ``perf_counter`` is ``CLOCK_MONOTONIC``, one clock per
booted kernel and time namespace, so a rank with rank 0's boot id and time namespace (``clock_id``) has
offset 0 exactly. Only ranks on other hosts ping.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

__all__ = ["estimate_offset", "measure_offset", "clock_id"]

ROUNDS = 10


def estimate_offset(samples: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(offset, error bound) in seconds from ping-pong samples ``(t_send, t_reference, t_receive)``.

    Example::

        >>> estimate_offset([(0.0, 10.5, 2.0), (3.0, 13.2, 3.4)])   # the second has the shorter round trip
        (10.0, 0.2)
    """
    t1, ts, t2 = min(samples, key=lambda s: s[2] - s[0])
    return round(ts - (t1 + t2) / 2, 12), round((t2 - t1) / 2, 12)


def clock_id() -> str:
    """What identifies this process's ``CLOCK_MONOTONIC``: the kernel's boot id and the time namespace."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return f"unknown:{os.getpid()}"  # no way to tell: measure
    try:
        ns = os.stat("/proc/self/ns/time").st_ino
    except OSError:
        ns = 0  # a kernel before time namespaces (5.6): one monotonic clock per boot
    return f"{boot}:{ns}"


def measure_offset(store: Any, rank: int, world: int, key: str, rounds: int = ROUNDS,
                   clock: str | None = None) -> tuple[float, float]:
    """This rank's (offset to rank 0's clock, error bound), through ``store``; collective over the ranks.

    Ranks publish their ``clock_id`` (``clock`` replaces it: a test forces a measurement); a rank on rank
    0's clock returns (0, 0) at once, the others ping. Rank 0 answers their ``rounds`` pings in rank order and
    returns (0, 0). ``key`` must be new to the store (it outlives a run: the caller puts the attempt and the
    run's number in it).
    """
    if world == 1 or store is None:
        return 0.0, 0.0
    me = clock if clock is not None else clock_id()
    store.set(f"{key}/{rank}/clock", me)
    if rank == 0:
        for r in range(1, world):
            if store.get(f"{key}/{r}/clock").decode() == me:
                continue
            for k in range(rounds):
                store.get(f"{key}/{r}/{k}/ping")  # blocks until rank r has sent it
                store.set(f"{key}/{r}/{k}/pong", repr(time.perf_counter()))
        return 0.0, 0.0
    if store.get(f"{key}/0/clock").decode() == me:
        return 0.0, 0.0
    samples = []
    for k in range(rounds):
        t1 = time.perf_counter()
        store.set(f"{key}/{rank}/{k}/ping", b"1")
        ts = float(store.get(f"{key}/{rank}/{k}/pong"))
        samples.append((t1, ts, time.perf_counter()))
    return estimate_offset(samples)
