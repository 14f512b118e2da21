"""The bench's rendering: the console table and lines, report.md/html and its plots, from bench.json.

Pure presentation: everything here reads the points and runs the analysis wrote; nothing decides or measures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from ..reporting import figure, legend_below, save, write_reports
from ..reporting.console import console, err_console
from .bench_analysis import thread_mismatch
from .ranks import plot_ranks, plot_timeline

__all__ = ["PLOTS", "write_plots", "write_report", "print_result"]

PLOTS = ("throughput.png", "efficiency.png", "breakdown.png", "ranks.png", "timeline.png")


def _table(points: list[dict[str, Any]], title: str) -> Table:
    """The console table of the points."""
    t = Table(title=title, title_justify="left")
    for col in ("procs", "samples/s", "speed-up", "efficiency", "scaling overhead ms", "data wait", "step ms",
                "spread"):
        t.add_column(col, justify="right")
    for p in points:
        t.add_row(str(p["world_size"]), f"{p['samples_per_s']:,.0f}", f"{p['speedup']:.2f}x",
                  f"{p['efficiency']:.0%}", f"{p['comm_overhead_s'] * 1e3:+.2f}", f"{p['data_wait_frac']:.1%}",
                  f"{p['step_time_s'] * 1e3:.2f}", f"{p['spread']:.1%}")
    return t


def _err(mid: list[float], ranges: list[list[float]]) -> list[list[float]]:
    """Asymmetric error bars (below, above) of ``mid`` from each point's [low, high] range."""
    return [[max(0.0, m - r[0]) for m, r in zip(mid, ranges)], [max(0.0, r[1] - m) for m, r in zip(mid, ranges)]]


def _throughput_plot(points: list[dict[str, Any]], out: Path) -> None:
    """Samples/s against processes, with the range over repeats and the ideal line."""
    ws = [p["world_size"] for p in points]
    base = points[0]
    fig, ax = figure()
    sps = [p["samples_per_s"] for p in points]
    ax.errorbar(ws, sps, yerr=_err(sps, [[min(p["samples_per_s_runs"]), max(p["samples_per_s_runs"])]
                                         for p in points]), fmt="o-", capsize=4, label="measured (median, range)")
    ax.plot(ws, [base["samples_per_s"] * w / base["world_size"] for w in ws], "--", color="gray", label="ideal")
    ax.set(xlabel="processes", ylabel="samples/s", title="Throughput against processes", xticks=ws)
    ax.legend()
    save(fig, out / PLOTS[0])


def _efficiency_plot(points: list[dict[str, Any]], out: Path) -> None:
    """Scaling efficiency against processes, with its range over pairings of runs."""
    ws = [p["world_size"] for p in points]
    fig, ax = figure()
    eff = [p["efficiency"] * 100 for p in points]
    ax.errorbar(ws, eff, yerr=_err(eff, [[x * 100 for x in p["efficiency_range"]] for p in points]), fmt="o-",
                capsize=4, label="median (bar: range over pairings of runs)")
    ax.axhline(100, ls="--", color="gray")
    ax.set(xlabel="processes", ylabel="scaling efficiency (%)", title="Scaling efficiency", xticks=ws,
           ylim=(0, max(110, max(p["efficiency_range"][1] * 100 for p in points) + 10)))
    ax.legend(fontsize=8)
    save(fig, out / PLOTS[1])


def _breakdown_plot(points: list[dict[str, Any]], out: Path) -> None:
    """Each point's step as measured data wait, measured compute and the rest, with the step's range."""
    fig, ax = figure()
    data = [p["step_time_s"] * p["data_wait_frac"] * 1e3 for p in points]
    comp = [min(p["compute_s"], p["step_time_s"]) * 1e3 if p["compute_s"] == p["compute_s"] else 0 for p in points]
    rest = [max(0.0, p["step_time_s"] * 1e3 - d - c) for p, d, c in zip(points, data, comp)]
    x = [str(p["world_size"]) for p in points]
    ax.bar(x, data, color="C1", label="data wait (measured)")
    ax.bar(x, comp, bottom=data, color="C0", label="forward+backward, slowest rank (measured)")
    # Only data wait and compute are measured apart; the rest is what is left of the step, named by what it can
    # hold: with one process there is no communication, so its rest is not called that.
    ones = [r if p["world_size"] == 1 else 0.0 for p, r in zip(points, rest)]
    many = [r if p["world_size"] > 1 else 0.0 for p, r in zip(points, rest)]
    below = [d + c for d, c in zip(data, comp)]
    if any(ones):
        ax.bar(x, ones, bottom=below, color="0.8", label="rest at 1 process: optimizer, framework (not measured apart)")
    ax.bar(x, many, bottom=below, color="0.55",
           label="rest: communication, waiting, optimizer (not measured apart)")
    steps = [p["step_time_s"] * 1e3 for p in points]
    ax.errorbar(x, steps, yerr=_err(steps, [[min(p["step_time_s_runs"]) * 1e3, max(p["step_time_s_runs"]) * 1e3]
                                             for p in points]), fmt="none", color="k", capsize=4,
                label="step time: range over repeats")
    ax.set(xlabel="processes", ylabel="ms per step (medians)", title="Step-time breakdown")
    legend_below(fig, ax, ncol=1)
    save(fig, out / PLOTS[2])


def write_plots(points: list[dict[str, Any]], runs: list[dict[str, Any]], out: Path) -> list[str]:
    """Draw the bench's plots into ``out`` (none without points); return the names of those written."""
    if not points:
        return []
    _throughput_plot(points, out)
    _efficiency_plot(points, out)
    _breakdown_plot(points, out)
    top, one = points[-1]["world_size"], points[0]["world_size"]
    if top > 1:
        at = lambda w: [r for r in runs if r["world_size"] == w]  # noqa: E731
        plot_ranks(at(top), at(one) if one == 1 else None, top, out / PLOTS[3],
                   f"Per rank: where the step goes at {top} processes")
        trace = next((r["timeline"] for r in at(top) if r.get("timeline") and Path(r["timeline"]).is_file()), None)
        if trace:
            plot_timeline(Path(trace), out / PLOTS[4])
    return [p for p in PLOTS if (out / p).is_file()]


def _result_blocks(points: list[dict[str, Any]], out: Path) -> list[tuple]:
    """The report's results: the table of points, how to read it, and the plots that were drawn."""
    rows = [[p["world_size"], f"{p['samples_per_s']:,.0f}", f"{p['speedup']:.2f}", f"{p['efficiency']:.1%}",
             " .. ".join(f"{x:.1%}" for x in p["efficiency_range"]),
             f"{p['comm_overhead_s'] * 1e3:+.3f}", f"{p['data_wait_frac']:.1%}",
             f"{p['step_time_s'] * 1e3:.3f}", f"{p['spread']:.1%}", p["global_batch"]] for p in points]
    head = ["processes", "samples/s", "speed-up", "efficiency", "efficiency range", "scaling overhead (ms/step)",
            "data wait", "step time (ms)", "spread over repeats", "global batch"]
    blocks: list[tuple] = [
        ("h2", "Results"), ("table", head, rows),
        ("p", "Efficiency = throughput(N) / (N x throughput(1)); scaling overhead = step time at N "
              "minus step time at 1 (weak scaling: same per-device batch): everything that grows with "
              "processes (communication, waiting for the slowest rank, contention for cores), not "
              "communication alone. 'spread' is (max - min) / "
              "median of samples/s over the repeats: differences smaller than it are noise."),
        ("img", PLOTS[0], "Throughput with the ideal (linear) line; vertical bars: range over repeats"),
        ("img", PLOTS[1], "Scaling efficiency; bars: range over every pairing of a run at N with a run "
                          "at the base size"),
        ("img", PLOTS[2], "Where a step's time goes (medians; bar: range of the step time over repeats); "
                          "only data wait and forward+backward are measured apart")]
    if (out / PLOTS[3]).is_file():
        blocks.append(("img", PLOTS[3], "Each rank's step at the largest size beside the 1-process step (medians "
                                        "over repeats; bar: range of the step time)"))
    if (out / PLOTS[4]).is_file():
        blocks.append(("img", PLOTS[4], "The last steps of one run at the largest size, per rank, from its "
                                        "timeline.json (open that file in ui.perfetto.dev for every step)"))
    return blocks


def write_report(out: Path, doc: dict[str, Any]) -> None:
    """Write report.md and report.html: the verdict, the results table, the plots, the commands run."""
    points = doc["points"]
    cfg = doc["config"]
    verdict = doc.get("verdict")
    blocks: list[tuple] = []
    if verdict:  # the doctor command goes in its own block, to copy, rather than inside the sentence
        line = verdict["line"].replace(": " + verdict["doctor_command"], " (the command below)")
        blocks.append(("p", f"Verdict: {line}"))
        if verdict["efficiency"] < 1.0:
            blocks += [("p", "Next, to find out why:"), ("pre", verdict["doctor_command"])]
    blocks += [("p", f"{cfg['scaling']} scaling, {cfg['repeat']} run(s) per point, model "
                                 f"{cfg['model']} on {cfg['data']}, {cfg['steps']} steps "
                                 f"({cfg['skip_first']} warm-up steps excluded), per-device batch at the base point "
                                 f"{cfg['batch_size']}. Machine: {doc['machine']}.")]
    if points:
        blocks += _result_blocks(points, out)
    if any("forecast_step_time_s" in p for p in points):
        blocks += [("h2", "Forecast beside the measurement (trainscale plan)"),
                   ("table", ["processes", "measured step (ms)", "forecast step (ms)", "forecast / measured"],
                    [[p["world_size"], f"{p['step_time_s'] * 1e3:.3f}", f"{p['forecast_step_time_s'] * 1e3:.3f}",
                      f"{p['forecast_step_time_s'] / p['step_time_s']:.2f}"] for p in points
                     if "forecast_step_time_s" in p])]
    mismatch = thread_mismatch(points)
    if mismatch:
        blocks.append(("p", f"Note: intra-op threads per process differ between points ({mismatch}): the smaller "
                       "runs had more cores each, so this is not a like-for-like comparison; pass --job.threads T "
                       "to fix it."))
    if doc.get("error"):
        e = doc["error"]
        blocks += [("h2", "Stopped by a failed run"),
                   ("p", f"processes={e['nproc']} repeat {e['repeat']}: {e['message']}"), ("pre", e["command"])]
    blocks += [("h2", "Commands"), ("pre", "\n".join(doc["commands"]))]
    write_reports(out, "report", "trainscale bench", blocks)


def print_result(doc: dict[str, Any], out: Path, plots: list[str]) -> None:
    """The console's account: the table, the verdict, the files written, a thread note and a failed run."""
    cfg = doc["config"]
    if doc["points"]:
        console.print(_table(doc["points"], f"trainscale bench ({cfg['scaling']} scaling, "
                                            f"{cfg['repeat']} run(s) per point, medians)"))
    if doc["verdict"]:
        console.print(doc["verdict"]["line"], markup=False, highlight=False)
    console.print(f"wrote {out / 'bench.json'}, {out / 'report.md'}, {out / 'report.html'}"
                  + "".join(f", {out / p}" for p in plots))
    mismatch = thread_mismatch(doc["points"])
    if mismatch:
        err_console.print(f"note: threads per process differ between points ({mismatch}); --job.threads T "
                          "compares like with like")
    failed = doc["error"]
    if failed:
        err_console.print(f"trainscale bench: run with {failed['nproc']} process(es) failed: {failed['message']}\n"
                          f"  command: {failed['command']}\n  sweep stopped; {len(doc['points'])} point(s) "
                          "measured before it are kept in bench.json", markup=False, highlight=False)
