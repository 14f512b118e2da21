"""The plan's report: a console table, plan.json (the pinned shape), plan.md, plan.html and PNG plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..costs.forecast import Point

__all__ = ["PLOTS", "plan_json", "console_table", "write_plan", "print_plan"]

PLOTS = ("plan-throughput.png", "plan-breakdown.png")
HEAD = ["devices", "nodes", "step ms", "compute ms", "exposed comm ms", "bubble ms", "straggler ms", "samples/s",
        "speed-up", "efficiency", "comm overhead ms", "bound"]


def _row(p: Point) -> list[str]:
    return [str(p.world_size), str(p.nodes), f"{p.step_time_s * 1e3:.2f}", f"{p.compute_s * 1e3:.2f}",
            f"{p.comm_exposed_s * 1e3:.2f}", f"{p.bubble_s * 1e3:.2f}", f"{p.straggler_s * 1e3:.2f}",
            f"{p.samples_per_s:,.1f}", f"{p.speedup:.2f}x", f"{p.efficiency:.0%}", f"{p.comm_overhead_s * 1e3:+.2f}",
            p.bound]


def plan_json(points: list[Point], assumptions: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"points": [{world_size, step_time_s, samples_per_s, speedup, efficiency, comm_exposed_s, bound, ...}],
    "assumptions": {...}}``."""
    return {"points": [p.to_json() for p in points], "assumptions": assumptions, **(extra or {})}


def console_table(points: list[Point], title: str) -> Any:
    """A rich table of the points."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    # Short headers so a 120-column console shows every number whole (plan.md carries the long ones).
    for h in ("N", "nodes", "step ms", "compute", "exp. comm", "bubble", "straggler", "samples/s", "speed-up",
              "eff.", "overhead", "bound"):
        t.add_column(h, justify="right", no_wrap=True)
    for p in points:
        t.add_row(*_row(p))
    return t


def _plots(points: list[Point], out: Path) -> None:
    from ..reporting import figure, save

    ws = [p.world_size for p in points]
    fig, ax = figure()
    ax.plot(ws, [p.speedup for p in points], "o-", label="forecast")
    ax.plot(ws, ws, "--", color="gray", label="linear")
    ax.set(xlabel="devices", ylabel="speed-up", title="Forecast speed-up", xscale="log", yscale="log")
    ax.legend()
    save(fig, out / PLOTS[0])
    fig, ax = figure()
    x = [str(w) for w in ws]
    bottom = [0.0] * len(points)
    for name, attr in (("compute", "compute_s"), ("exposed communication", "comm_exposed_s"),
                       ("pipeline bubble", "bubble_s"), ("straggler wait", "straggler_s")):
        vals = [getattr(p, attr) * 1e3 for p in points]
        ax.bar(x, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(xlabel="devices", ylabel="ms per step", title="Where a step's time goes (forecast)")
    ax.legend(fontsize=8)
    save(fig, out / PLOTS[1])


def write_plan(out: Path, doc: dict[str, Any], points: list[Point], notes: list[str],
               compare: list[tuple[int, list[tuple[str, float, float]]]] | None = None) -> list[Path]:
    """Write plan.json, plan.md, plan.html and the plots into ``out``; return the paths."""
    from ..reporting import write_json, write_reports

    out.mkdir(parents=True, exist_ok=True)
    _plots(points, out)
    blocks: list[tuple] = [("h2", "Forecast"), ("table", HEAD, [_row(p) for p in points]),
                           ("img", PLOTS[0], "Forecast speed-up against linear"),
                           ("img", PLOTS[1], "Step time split (forecast)")]
    if compare:
        rows = [[w, name, f"{sps:,.1f}", f"{eff:.0%}"] for w, ranked in compare for name, sps, eff in ranked]
        blocks += [("h2", "Strategies compared"), ("table", ["devices", "strategy", "samples/s", "efficiency"], rows)]
    if notes:
        blocks += [("h2", "Conclusions")] + [("p", n) for n in notes]
    blocks += [("h2", "Assumptions"), ("pre", "\n".join(f"{k}: {v}" for k, v in doc["assumptions"].items()))]
    write_json(out / "plan.json", doc)
    md, page = write_reports(out, "plan", "trainscale plan", blocks)
    return [out / "plan.json", md, page, *(out / p for p in PLOTS)]


def print_plan(points: list[Point], title: str, notes: list[str], files: list[Path | str]) -> None:
    """The console's account: the table of the points, the conclusions, the files written."""
    from ..reporting.console import console

    console.print(console_table(points, title))
    for n in notes:
        console.print(n, markup=False, highlight=False)
    console.print("wrote " + ", ".join(str(f) for f in files), markup=False, highlight=False)
