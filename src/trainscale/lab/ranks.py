"""The lab reports' per-rank picture: where each rank's step goes at N processes, beside the 1-process step.

Built from what every run summary holds per rank (median step time, forward+backward, data wait; a phased
run's ``rank_steps`` rows where a phase has no per-rank data wait), so it costs no extra run. A rank that
computes faster than the slowest one waits for it at the gradient exchange: that wait is drawn as its own
segment, so a straggler shows as one long compute bar beside a wait on every other rank. ``plot_timeline``
draws the last steps of a ``--timeline`` trace per rank (a Gantt chart).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..reporting import figure, legend_below, save
from ..schema import Col, cell
from .stats import median

__all__ = ["rank_segments", "plot_ranks", "plot_timeline", "SEGMENTS"]

SEGMENTS = ("data wait", "forward+backward", "waiting for the slowest rank", "exchange", "rest of the step")


def _wait(s: dict[str, Any], rank: int) -> float:
    """Median data wait per step of ``rank`` in one run (or phase) summary."""
    # A phase's own rows first: a phase summary carries the whole run's ``rank_data_wait_s`` too, a median over
    # every phase (seen on an H200: a 79 ms wait in the base phase drawn as none, the no-data phases' median).
    rows = s.get("rank_steps") or []
    if rank < len(rows) and rows[rank]:
        return median(r[Col.DATA_WAIT] for r in rows[rank])
    waits = s.get("rank_data_wait_s")
    if waits and rank < len(waits):
        return waits[rank]
    return float(s.get("data_wait_frac") or 0.0) * s["step_time_s"]


def _exposed(s: dict[str, Any], rank: int) -> float:
    """Median exposed exchange wait per step of ``rank`` (the accounting's column), NaN where not measured."""
    rows = s.get("rank_steps") or []
    waits = [cell(r, Col.COMM_WAIT) for r in rows[rank]] if rank < len(rows) else []
    waits = [w for w in waits if math.isfinite(w)]
    return median(waits) if waits else float("nan")


def rank_segments(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank, medians over ``runs`` (repeats of one configuration) of each segment, and the step's range.

    ``exchange`` is the measured exposed wait in the exchange after backward (the per-rank accounting), less the
    part of it spent waiting for the slowest rank, which has its own segment; 0 where a run did not measure it.
    The rest of the step is what was not measured apart: the optimizer and the framework, and the exposed
    communication where it was not measured.
    """
    size = min(len(s.get("rank_step_time_s") or [s["step_time_s"]]) for s in runs)
    out = []
    for rank in range(size):
        step = [(s.get("rank_step_time_s") or [s["step_time_s"]])[rank] for s in runs]
        comp = [(s.get("rank_compute_s") or [float("nan")])[rank] for s in runs]
        slowest = [max((c for c in s.get("rank_compute_s") or [] if math.isfinite(c)), default=float("nan"))
                   for s in runs]
        wait = [_wait(s, rank) for s in runs]
        behind = median(max(0.0, sl - c) for sl, c in zip(slowest, comp))
        seg = {"data wait": median(wait), "forward+backward": median(comp), "waiting for the slowest rank": behind,
               "exchange": median(_exposed(s, rank) for s in runs) - (behind if math.isfinite(behind) else 0.0)}
        seg = {k: max(0.0, v) if math.isfinite(v) else 0.0 for k, v in seg.items()}
        t = median(step)
        seg["rest of the step"] = max(0.0, t - sum(seg.values()))
        out.append({"rank": rank, "step_time_s": t, "step_range_s": [min(step), max(step)], **seg})
    return out


def plot_ranks(at_n: list[dict[str, Any]], at_1: list[dict[str, Any]] | None, n: int, path: Path,
               title: str) -> Path:
    """Horizontal stacked bars, one per rank at ``n`` processes (and one for the 1-process run), error bars
    on each step time (its range over the repeats)."""
    rows = [("1 process", r) for r in (rank_segments(at_1)[:1] if at_1 else [])]
    rows += [(f"rank {r['rank']} of {n}", r) for r in rank_segments(at_n)]
    rows = rows[::-1]  # matplotlib draws the first bar at the bottom
    fig, ax = figure(7.0, 1.3 + 0.4 * len(rows))
    labels = [name for name, _ in rows]
    left = [0.0] * len(rows)
    one = [name == "1 process" for name in labels]
    # The rest of the step is named by what it can hold: with one process there is no communication, and where
    # the exchange was measured it is drawn as measured, not left in the rest.
    measured = any(r["exchange"] > 0 for o, (_, r) in zip(one, rows) if not o)
    parts = [("data wait", "data wait", "C1", None), ("forward+backward", "forward+backward", "C0", None),
             ("waiting for the slowest rank", "waiting for the slowest rank", "C3", None),
             ("exchange", "exchange, measured (exposed wait after backward)", "C2", False),
             ("rest of the step", f"rest at {n} processes, not measured apart ("
              + ("optimizer, framework)" if measured else "communication, optimizer)"), "0.55", False),
             ("rest of the step", "rest at 1 process, not measured apart (optimizer, framework)", "0.82", True)]
    for seg, label, color, only_one in parts:
        vals = [r[seg] * 1e3 if only_one is None or o == only_one else 0.0 for o, (_, r) in zip(one, rows)]
        if any(vals):
            ax.barh(labels, vals, left=left, color=color, label=label, height=0.6)
        left = [a + b for a, b in zip(left, vals)]
    mids = [r["step_time_s"] * 1e3 for _, r in rows]
    lo = [max(0.0, m - r["step_range_s"][0] * 1e3) for m, (_, r) in zip(mids, rows)]
    hi = [max(0.0, r["step_range_s"][1] * 1e3 - m) for m, (_, r) in zip(mids, rows)]
    ax.errorbar(mids, labels, xerr=[lo, hi], fmt="|", color="k", capsize=3,
                label="step time: median, range over repeats")
    ax.set(xlabel="ms per step (medians)", title=title)
    legend_below(fig, ax)
    return save(fig, path)


def plot_timeline(trace: Path, path: Path, steps: int = 4) -> Path | None:
    """A Gantt chart of the last ``steps`` steps of every rank from a ``--timeline`` trace (``timeline.json``).

    Each rank is one row of spans (data wait, forward+backward, waiting for the slowest rank, exposed
    communication, optimizer), on one clock: a straggler shows as the others' red waits lined up with its
    longer compute. None when the trace holds no steps.
    """
    import json

    from ..schema import SPANS

    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    ranks = sorted({e["pid"] for e in events})
    last = sorted({e["args"]["step"] for e in events if e.get("cat") == "phase"})[-steps:]
    shown = [e for e in events if e.get("cat") == "phase" and e["args"]["step"] in last]
    if not shown:
        return None
    t0 = min(e["ts"] for e in shown)
    colors = dict(zip(SPANS, ("C1", "0.8", "C0", "C3", "C2", "C4")))
    fig, ax = figure(7.0, 1.3 + 0.45 * len(ranks))
    for name in SPANS:
        for rank in ranks:
            spans = [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in shown if e["pid"] == rank and e["name"] == name]
            if spans:  # one legend entry per span name
                ax.broken_barh(spans, (rank - 0.3, 0.6), color=colors[name],
                               label=None if name in ax.get_legend_handles_labels()[1] else name)
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set(xlabel="ms since the first step shown",
           title=f"Timeline of the last {len(last)} measured steps (--timeline)")
    legend_below(fig, ax, ncol=3)
    return save(fig, path)
