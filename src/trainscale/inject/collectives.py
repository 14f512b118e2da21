"""The frameworks' own collectives outside DDP, timed: the seconds the training thread is blocked in them per step.

An unmodified script's framework exchanges outside DDP every step: the Hugging Face Trainer gathers each batch's
token count (``get_batch_samples``), accelerate gathers or reduces losses and metrics, Lightning's loop broadcasts
a tensor from rank 0 (``_broadcast_sigterm_tensor``). Those calls still run when the doctor's ``no_comm`` phase has
switched DDP's exchange off, and at N processes each holds its rank until the slowest one arrives: without this
timer their seconds read as slower compute. The ``torch.distributed`` functions (``FUNCTIONS``) are wrapped in
place, in ``torch.distributed`` and in ``distributed_c10d`` (whose object collectives call the tensor ones).

Not counted: a call nested in a counted one (``all_gather_object``'s own ``all_gather``), calls from trainscale's
own code (the agent's broadcast of rank 0's weights as ``no_comm`` ends) and from DDP's Python (its bucketed
all-reduce runs in C++ in the reducer and never passes here; its buffer broadcast is ``_broadcast_coalesced``, not
wrapped). An asynchronous call (``async_op=True``) counts only its launch: its wait is in ``Work.wait``.

The blocked seconds are taken out of the compute clock when a call falls inside a forward+backward (its mark
``t0`` moves on by them), so a rank waiting in a framework's collective never looks slower at computing.

The first ``SITE_CALLS`` calls also keep where they came from: the line of the user's script that led to them
(the innermost frame outside the installed packages, the standard library and trainscale) and the framework's
functions on the way, so that the report can point at ``self.log(..., sync_dist=True)`` rather than at Lightning.
"""

from __future__ import annotations

import functools
import linecache
import math
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any

from ..about import user_code

__all__ = ["FUNCTIONS", "CollectiveTimer", "install_collectives", "add_to_summary"]

FUNCTIONS = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "barrier", "reduce", "gather",
             "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
             "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
             "monitored_barrier", "_all_gather_base", "_reduce_scatter_base")
_SKIPPED_CALLERS = ("trainscale.", "torch.nn.parallel.")  # trainscale's own exchange; DDP's, timed as DDP's
SITE_CALLS = 64  # calls whose call site is kept (a stack walk each); the rest are only timed


def call_site(frame: Any, keep: int = 12) -> tuple[str, str, str]:
    """From ``frame`` outwards: the user's line (``file:line``), its code, and the framework functions on the way
    (innermost first, at most ``keep``, torch's own left out); ("", "", via) when no user frame is on the stack."""
    via: list[str] = []
    while frame is not None:
        code = frame.f_code
        if user_code(code.co_filename):
            where = f"{os.path.basename(code.co_filename)}:{frame.f_lineno}"
            return where, linecache.getline(code.co_filename, frame.f_lineno).strip(), " < ".join(via)
        module = frame.f_globals.get("__name__", "")
        if len(via) < keep and not module.startswith(("torch.", "trainscale.")):
            via.append(f"{module}.{code.co_name}")
        frame = frame.f_back
    return "", "", " < ".join(via)


class CollectiveTimer:
    """This rank's seconds and calls in the wrapped collectives: the current step's, and each measured step's.

    Example::

        timer = CollectiveTimer()
        ...a step that calls torch.distributed.all_reduce once...
        timer.step_done(ins, mode, 5)     # rows: [(phase, cycle, seconds, 1)] once step 5 is past ins.warm
    """

    __slots__ = ("seconds", "calls", "depth", "paused", "goes_on", "counts", "rows", "clock", "sites", "sites_left")

    def __init__(self, goes_on: Any = None) -> None:
        self.seconds, self.calls, self.depth = 0.0, 0, 0
        self.paused = False  # an evaluation pass between steps: its calls are no step's (``Agent._evaluation``)
        self.goes_on = goes_on  # called at a call while paused: False when the pass has ended there
        self.counts = [0] * len(FUNCTIONS)  # calls per function over the measured steps
        # per measured step: (its phase when timed, its cycle, seconds, calls)
        self.rows: list[tuple[str | None, int, float, int]] = []
        self.clock: Any = None  # the run's ComputeClock on CPU (its mark moves past a wait), else None
        self.sites: Counter[tuple[str, str, str, str]] = Counter()  # (function, where, code, via): calls
        self.sites_left = SITE_CALLS

    def wrap(self, index: int, fn: Any) -> Any:
        """``fn`` (``FUNCTIONS[index]``) timed into this step, unless nested or called by trainscale or DDP."""
        timer = self

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if timer.depth or timer.paused and timer.goes_on() or sys._getframe(1).f_globals.get(
                    "__name__", "").startswith(_SKIPPED_CALLERS):
                return fn(*args, **kwargs)
            timer.depth = 1
            if timer.sites_left:
                timer.sites_left -= 1
                timer.sites[(FUNCTIONS[index], *call_site(sys._getframe(1)))] += 1
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t
                timer.depth = 0
                timer.seconds += dt
                timer.calls += 1
                timer.counts[index] += 1
                if timer.clock is not None:
                    timer.clock.t0 += dt  # a wait inside forward+backward is not compute

        timed.__wrapped_by_trainscale__ = True  # type: ignore[attr-defined]
        return timed

    def step_done(self, ins: Any, mode: Any, done: int) -> None:
        """Iteration ``done`` (0: the first, untimed) ended: keep its seconds and calls when the run's instruments
        ``ins`` measure it (``mode``: its experiment), and start the next."""
        if ins is not None and self.clock is None and not ins.clock.cuda:
            self.clock = ins.clock  # on a GPU the clock times the device: a host wait is not in it
        if ins is not None and done > ins.warm:
            self.rows.append((mode.phase if mode.timed else None, mode.cycle, self.seconds, self.calls))
        else:  # warm-up's calls (set-up included) are not counted, nor are their call sites kept
            self.counts = [0] * len(FUNCTIONS)
            self.sites.clear()
            self.sites_left = SITE_CALLS
        self.seconds, self.calls = 0.0, 0

    def local(self) -> dict[str, Any]:
        """This rank's figures for rank 0: per phase (None: every measured step) its [cycle, seconds] rows and
        calls a step, and the calls a step of each function."""
        rows = self.rows
        keys: list[str | None] = [None, *dict.fromkeys(p for p, _, _, _ in rows if p is not None)]
        mine = {k: [r for r in rows if k is None or r[0] == k] for k in keys}
        return {"steps": {k: [[float(c), s] for _, c, s, _ in v] for k, v in mine.items()},
                "calls": {k: _mean([n for _, _, _, n in v]) for k, v in mine.items()},
                "by_function": {f: c / len(rows) for f, c in zip(FUNCTIONS, self.counts) if c and rows},
                "sites": [{"function": f, "where": w, "code": c, "via": v, "calls": n}
                          for (f, w, c, v), n in self.sites.most_common(4)]}


def install_collectives(torch: Any, agent: Any) -> str:
    """Wrap the ``torch.distributed`` collectives (now, or once it is imported) to time them into ``agent``."""
    if not hasattr(torch, "distributed") or not torch.distributed.is_available():
        return "not measured: this PyTorch has no torch.distributed"
    from .hooks import after_import

    after_import("torch.distributed", lambda module: _wrap_all(module, agent.collectives))
    return "measured"


def _wrap_all(dist: Any, timer: CollectiveTimer) -> None:
    """Replace each function of ``FUNCTIONS`` in ``torch.distributed`` and ``distributed_c10d`` by one wrapper."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    for i, name in enumerate(FUNCTIONS):
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "__wrapped_by_trainscale__", False):
            continue
        timed = timer.wrap(i, fn)
        setattr(dist, name, timed)
        if c10d is not None and getattr(c10d, name, None) is fn:
            setattr(c10d, name, timed)


def add_to_summary(summary: dict[str, Any], per_rank: list[dict[str, Any] | None]) -> None:
    """The run summary's fields, over every measured step and per phase: each rank's seconds a step blocked in the
    framework's own collectives outside DDP (median, and the timed steps as [cycle, seconds] rows) and rank 0's
    calls a step."""
    ranks = [r for r in per_rank if r is not None]
    if not ranks or len(ranks) != len(per_rank):
        return
    parts: list[tuple[Any, dict[str, Any]]] = [(None, summary), *(summary.get("phases") or {}).items()]
    for phase, part in parts:
        steps = [r["steps"].get(phase, []) for r in ranks]
        part["rank_framework_collective_s"] = [_median([s for _, s in rows]) for rows in steps]
        part["framework_collective_calls_per_step"] = ranks[0]["calls"].get(phase, math.nan)
        if phase is not None:
            part["rank_framework_collective_steps"] = steps
    summary["framework_collectives"] = {"calls_per_step": ranks[0]["by_function"],
                                        "sites": ranks[0].get("sites", [])}


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def _mean(xs: list[int]) -> float:
    return statistics.fmean(xs) if xs else math.nan
