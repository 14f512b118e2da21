"""``--timeline``: each rank's steps as spans on one Chrome-trace / Perfetto timeline (``timeline.json``).

Built from host clock readings the run takes anyway or adds at no cost (``time.perf_counter`` at the
step's seams) and from the compute clock; no host sync is added to the step. Per rank and step, the
spans tile the step exactly: data wait, host work before forward (a log point's metrics, the user's
code between steps), forward + backward (the compute
clock), waiting for the slowest rank (its compute minus this rank's, from the gathered clocks),
exposed communication (the rest, until the optimizer starts) and the optimizer.
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any

from ...config import SPANS
from .protocol import Instrument, StepEnd

__all__ = ["StepTimeline", "build_trace", "write_trace", "SPANS"]


Row = tuple[int, float, float, float, float, float, float, float]  # step, t0, wait, fb0, compute, call, opt, end


class StepTimeline(Instrument):
    """The host times of the last ``keep`` measured steps of this rank (seconds since the epoch)."""

    __slots__ = ("rows", "offset", "_fb0", "_call", "_opt")

    def __init__(self, keep: int):
        self.rows: deque[tuple[int, float, float, float, float, float, float]] = deque(maxlen=keep)
        # perf_counter is one monotonic clock per machine; the epoch offset lines ranks of several hosts up.
        self.offset = time.time() - time.perf_counter()
        self._fb0 = self._call = self._opt = 0.0

    def forward_starts(self, now: float) -> None:
        if not self._fb0:  # the first micro-step's forward
            self._fb0 = now

    def step_called(self, now: float) -> None:
        """``run.step()`` entered: backward (and DDP's wait for its overlapped all-reduces) has returned."""
        self._call = now

    def optimizer_starts(self, now: float) -> None:
        self._opt = now

    def step_done(self, step: int, t0: float, wait: float, end: float, measured: bool) -> None:
        if measured:
            fb0 = self._fb0 or t0
            self.rows.append((step, t0, wait, fb0, self._call or fb0, self._opt or self._call or fb0, end))
        self._fb0 = self._call = self._opt = 0.0

    def on_forward_start(self, t: float) -> None:
        self.forward_starts(t)

    def on_step_called(self, t: float) -> None:
        self.step_called(t)

    def on_optimizer_start(self, t: float) -> None:
        self.optimizer_starts(t)

    def on_step_end(self, end: StepEnd) -> None:
        self.step_done(end.step, end.t_start, end.wait_s, end.t_end, end.measured)

    def export(self, compute: list[float], first_measured: int) -> list[Row]:
        """Rows with their compute seconds (``compute[i]`` is measured step ``first_measured + i``)."""
        o = self.offset
        out = []
        for step, t0, wait, fb0, call, opt, end in self.rows:
            i = step - first_measured
            c = compute[i] if 0 <= i < len(compute) else 0.0
            out.append((step, t0 + o, wait, fb0 + o, c, call + o, opt + o, end + o))
        return out


def _spans(row: Row, slowest_compute: float) -> list[tuple[str, float, float]]:
    """(name, start, end) spans that tile one step of one rank."""
    step, t0, wait, fb0, compute, call, opt, end = row
    marks = [t0]
    t_wait = min(t0 + wait, end)
    t_fb0 = min(max(fb0, t_wait), end)
    t_fb1 = min(t_fb0 + compute, max(call, t_fb0), end)  # CUDA compute is device time: never past the host's seams
    t_slow = min(t_fb1 + max(0.0, slowest_compute - compute), max(opt, t_fb1), end)
    t_opt = min(max(opt, t_slow), end)
    marks += [t_wait, t_fb0, t_fb1, t_slow, t_opt, end]
    return [(name, a, b) for name, a, b in zip(SPANS, marks, marks[1:]) if b > a]


def build_trace(per_rank: list[list[Row]], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Chrome-trace JSON object: one process per rank, a ``step N`` span around each step's phases."""
    slowest: dict[int, float] = {}
    for rows in per_rank:
        for r in rows:
            slowest[r[0]] = max(slowest.get(r[0], 0.0), r[4])
    events: list[dict[str, Any]] = []
    for rank, rows in enumerate(per_rank):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        for row in rows:
            us = lambda t: round(t * 1e6, 3)  # noqa: E731 - Chrome traces count microseconds
            events.append({"name": f"step {row[0]}", "cat": "step", "ph": "X", "pid": rank, "tid": 0,
                           "ts": us(row[1]), "dur": round(us(row[7]) - us(row[1]), 3)})
            for name, a, b in _spans(row, slowest[row[0]]):
                events.append({"name": name, "cat": "phase", "ph": "X", "pid": rank, "tid": 0,
                               "ts": us(a), "dur": round(us(b) - us(a), 3), "args": {"step": row[0]}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": dict(meta or {})}


def write_trace(path: Path, per_rank: list[list[Row]], meta: dict[str, Any] | None = None) -> None:
    """Write ``build_trace`` to ``path`` (open it in https://ui.perfetto.dev or chrome://tracing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(build_trace(per_rank, meta)) + "\n")
