"""``trainscale bench``: a scaling sweep over world sizes, with a report.

For each world size it runs ``trainscale train --nproc N [your options] --json ...`` ``--repeat`` times and
reports samples/s, speed-up, scaling efficiency = throughput(N) / (N x throughput(1)) with its range over
pairings of repeats, the scaling overhead per iteration (T_N - T_1 at the same per-device batch, as scaling overhead is usually defined:
everything that grows with processes, not communication alone), data-wait fraction, medians and spreads,
a per-rank chart and a timeline of one run at the largest size. The report opens with a verdict and the
``trainscale doctor`` command to run next. Weak scaling (fixed per-device batch) by default;
``--scaling strong`` fixes the global batch.

Example::

    trainscale bench --nproc 1,2 --out runs/bench
    trainscale bench --nproc 1,4,8 --model se_resnext152 --data synthetic --batch-size 40 --repeat 3
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..config import ConfigError, config_to_dict
from ..jobs import LauncherOptions, RunFailed, RunSpec, check_train_args, run_train, split_script
from ..reporting import figure, legend_below, save, write_json, write_reports
from ..reporting.console import console, err_console
from .common import machine_description, parse_nproc_list
from .ranks import plot_ranks, plot_timeline
from .stats import job_step_time, median, rel_spread
from .verdict import bench_verdict

__all__ = ["main", "make_point", "complete_points", "PLOTS"]

PLOTS = ("throughput.png", "efficiency.png", "breakdown.png", "ranks.png", "timeline.png")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainscale bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Scaling sweep: run the training job at several world sizes and report speed-up, "
                    "scaling efficiency and scaling overhead. Other options go to `trainscale train`, or, after `-- "
                    "[python] my_train.py [args]`, to your own script on the run API (trainscale.init()).",
        epilog="examples:\n  trainscale bench --nproc 1,2 --out runs/bench\n"
               "  trainscale bench --nproc 1,2 -- python my_train.py --my-args     # your own script on the run API\n"
               "  trainscale bench --nproc 1,2,4 --scaling strong --batch-size 128 --repeat 5\n"
               "  trainscale bench --nproc 8 --nnodes 2 --rdzv-endpoint node0:29400 ...   # on each node")
    p.add_argument("--nproc", default="1,2", help="processes per node to sweep, comma-separated (default 1,2)")
    p.add_argument("--repeat", type=int, default=3, help="runs per point; medians and spreads over them (default 3)")
    p.add_argument("--scaling", choices=("weak", "strong"), default="weak",
                   help="weak: fixed per-device batch (default); strong: fixed global batch")
    p.add_argument("--out", default="runs/bench", help="folder for bench.json, report.md/html and plots")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take before it is ended")
    p.add_argument("--nnodes", default="1", help="nodes (passed to the launcher); run the same bench on each")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr")
    p.add_argument("--master-port", type=int)
    p.add_argument("--rdzv-endpoint")
    p.add_argument("--calibration", metavar="FILE",
                   help="a `trainscale plan calibrate` file of this job: show the forecast step time beside each point")
    return p


def _run_args(user: list[str], scaling: str, base_batch: int, base_n: int, nproc: int, world: int) -> list[str]:
    if scaling == "weak":
        return list(user)
    global_batch = base_batch * base_n
    return [*user, "--data.batch_size", str(global_batch // world)]


def make_point(nproc: int, world: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and spreads of one world size's repeated runs (speed-up etc. are added by complete_points)."""
    sps = [r["samples_per_s"] for r in runs]
    return {
        "nproc": nproc, "world_size": world, "repeats": len(runs),
        "samples_per_s": median(sps), "spread": rel_spread(sps),
        "step_time_s": median(job_step_time(r) for r in runs),
        "step_time_spread": median(r.get("step_time_spread") for r in runs),
        "data_wait_frac": median(r.get("data_wait_frac") for r in runs),
        "compute_s": median(max(r.get("rank_compute_s") or [float("nan")]) for r in runs),
        "global_batch": runs[0]["global_batch"], "batch_size": runs[0]["batch_size"],
        "threads": runs[0].get("threads"),
        "measured_steps": median(r.get("measured_steps") for r in runs),
        "samples_per_s_runs": sps, "step_time_s_runs": [job_step_time(r) for r in runs],
    }


def complete_points(points: list[dict[str, Any]], scaling: str) -> list[dict[str, Any]]:
    """Speed-up, efficiency, its range and the scaling overhead against the smallest world size measured."""
    if not points:
        return points
    base = points[0]
    for p in points:
        ratio = p["world_size"] / base["world_size"]
        p["speedup"] = p["samples_per_s"] / base["samples_per_s"]
        # efficiency = throughput(N) / (N x throughput(1)) (relative to the base world size when it is not 1)
        p["efficiency"] = p["samples_per_s"] / (ratio * base["samples_per_s"])
        ideal_t = base["step_time_s"] if scaling == "weak" else base["step_time_s"] / ratio
        # Everything that grows with processes (communication, waiting, contention), not communication alone;
        # comm_overhead_s is kept under its first name for readers of bench.json.
        p["scaling_overhead_s"] = p["comm_overhead_s"] = p["step_time_s"] - ideal_t
        # Range of the efficiency over every pairing of a run here with a run at the base size (its error bar).
        pairs = [t / (ratio * b) for t in p.get("samples_per_s_runs") or [] for b in base.get("samples_per_s_runs")
                 or [] if b > 0]
        p["efficiency_range"] = [min(pairs), max(pairs)] if pairs else [p["efficiency"], p["efficiency"]]
    return points


def _table(points: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("procs", "samples/s", "speed-up", "efficiency", "scaling overhead ms", "data wait", "step ms",
                "spread"):
        t.add_column(col, justify="right")
    for p in points:
        t.add_row(str(p["world_size"]), f"{p['samples_per_s']:,.0f}", f"{p['speedup']:.2f}x",
                  f"{p['efficiency']:.0%}", f"{p['comm_overhead_s'] * 1e3:+.2f}", f"{p['data_wait_frac']:.1%}",
                  f"{p['step_time_s'] * 1e3:.2f}", f"{p['spread']:.1%}")
    return t


def _plots(points: list[dict[str, Any]], runs: list[dict[str, Any]], out: Path) -> list[str]:
    ws = [p["world_size"] for p in points]
    base = points[0]

    def err(mid: list[float], ranges: list[list[float]]) -> list[list[float]]:
        return [[max(0.0, m - r[0]) for m, r in zip(mid, ranges)], [max(0.0, r[1] - m) for m, r in zip(mid, ranges)]]

    fig, ax = figure()
    sps = [p["samples_per_s"] for p in points]
    ax.errorbar(ws, sps, yerr=err(sps, [[min(p["samples_per_s_runs"]), max(p["samples_per_s_runs"])]
                                        for p in points]), fmt="o-", capsize=4, label="measured (median, range)")
    ax.plot(ws, [base["samples_per_s"] * w / base["world_size"] for w in ws], "--", color="gray", label="ideal")
    ax.set(xlabel="processes", ylabel="samples/s", title="Throughput against processes", xticks=ws)
    ax.legend()
    save(fig, out / PLOTS[0])
    fig, ax = figure()
    eff = [p["efficiency"] * 100 for p in points]
    ax.errorbar(ws, eff, yerr=err(eff, [[x * 100 for x in p["efficiency_range"]] for p in points]), fmt="o-",
                capsize=4, label="median (bar: range over pairings of runs)")
    ax.axhline(100, ls="--", color="gray")
    ax.set(xlabel="processes", ylabel="scaling efficiency (%)", title="Scaling efficiency", xticks=ws,
           ylim=(0, max(110, max(p["efficiency_range"][1] * 100 for p in points) + 10)))
    ax.legend(fontsize=8)
    save(fig, out / PLOTS[1])
    fig, ax = figure()
    data = [p["step_time_s"] * p["data_wait_frac"] * 1e3 for p in points]
    comp = [min(p["compute_s"], p["step_time_s"]) * 1e3 if p["compute_s"] == p["compute_s"] else 0 for p in points]
    rest = [max(0.0, p["step_time_s"] * 1e3 - d - c) for p, d, c in zip(points, data, comp)]
    x = [str(w) for w in ws]
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
    ax.errorbar(x, steps, yerr=err(steps, [[min(p["step_time_s_runs"]) * 1e3, max(p["step_time_s_runs"]) * 1e3]
                                            for p in points]), fmt="none", color="k", capsize=4,
                label="step time: range over repeats")
    ax.set(xlabel="processes", ylabel="ms per step (medians)", title="Step-time breakdown")
    legend_below(fig, ax, ncol=1)
    save(fig, out / PLOTS[2])
    top, one = points[-1]["world_size"], points[0]["world_size"]
    if top > 1:
        at = lambda w: [r for r in runs if r["world_size"] == w]  # noqa: E731
        plot_ranks(at(top), at(one) if one == 1 else None, top, out / PLOTS[3],
                   f"Per rank: where the step goes at {top} processes")
        trace = next((r["timeline"] for r in at(top) if r.get("timeline") and Path(r["timeline"]).is_file()), None)
        if trace:
            plot_timeline(Path(trace), out / PLOTS[4])
    return [p for p in PLOTS if (out / p).is_file()]


def _report(out: Path, doc: dict[str, Any]) -> None:
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
        rows = [[p["world_size"], f"{p['samples_per_s']:,.0f}", f"{p['speedup']:.2f}", f"{p['efficiency']:.1%}",
                 " .. ".join(f"{x:.1%}" for x in p["efficiency_range"]),
                 f"{p['comm_overhead_s'] * 1e3:+.3f}", f"{p['data_wait_frac']:.1%}",
                 f"{p['step_time_s'] * 1e3:.3f}", f"{p['spread']:.1%}", p["global_batch"]] for p in points]
        blocks += [("h2", "Results"),
                   ("table", ["processes", "samples/s", "speed-up", "efficiency", "efficiency range",
                              "scaling overhead (ms/step)",
                              "data wait", "step time (ms)", "spread over repeats", "global batch"], rows),
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
    if any("forecast_step_time_s" in p for p in points):
        blocks += [("h2", "Forecast beside the measurement (trainscale plan)"),
                   ("table", ["processes", "measured step (ms)", "forecast step (ms)", "forecast / measured"],
                    [[p["world_size"], f"{p['step_time_s'] * 1e3:.3f}", f"{p['forecast_step_time_s'] * 1e3:.3f}",
                      f"{p['forecast_step_time_s'] / p['step_time_s']:.2f}"] for p in points
                     if "forecast_step_time_s" in p])]
    threads = {p["world_size"]: p.get("threads") for p in points}
    if len(set(threads.values())) > 1:
        blocks.append(("p", "Note: intra-op threads per process differ between points (" +
                       ", ".join(f"{t} at {w}" for w, t in threads.items()) + "): the smaller runs had more cores "
                       "each, so this is not a like-for-like comparison; pass --job.threads T to fix it."))
    if doc.get("error"):
        e = doc["error"]
        blocks += [("h2", "Stopped by a failed run"),
                   ("p", f"processes={e['nproc']} repeat {e['repeat']}: {e['message']}"), ("pre", e["command"])]
    blocks += [("h2", "Commands"), ("pre", "\n".join(doc["commands"]))]
    write_reports(out, "report", "trainscale bench", blocks)


def main(argv: list[str]) -> int:
    """Entry of ``trainscale bench``."""
    argv, script = split_script(argv)
    args, rest = _parser().parse_known_args(argv)
    nprocs = parse_nproc_list(args.nproc)
    if args.repeat < 1:
        raise ConfigError("--repeat", args.repeat, "must be >= 1")
    launcher = LauncherOptions(args.nnodes, args.node_rank, args.master_addr, args.master_port, args.rdzv_endpoint)
    nnodes = int(str(args.nnodes).split(":")[-1])
    cfg = check_train_args(rest)
    forecast = {}
    if args.calibration:  # checked before any run: another job's calibration is refused now
        from ..sim.beside import forecast_steps

        forecast = forecast_steps(args.calibration, rest, [n * nnodes for n in nprocs])
    if args.scaling == "strong":
        global_batch = cfg.data.batch_size * nprocs[0] * nnodes
        bad = [n for n in nprocs if global_batch % (n * nnodes)]
        if bad:
            raise ConfigError("--batch-size", cfg.data.batch_size, f"strong scaling keeps the global batch "
                              f"{global_batch}; it must divide by every world size (not by {bad[0] * nnodes})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "points": [], "runs": [], "commands": [], "error": None, "machine": machine_description(),
        "config": {"scaling": args.scaling, "repeat": args.repeat, "nproc": nprocs, "nnodes": args.nnodes,
                   "train_args": rest, "script": script, "model": cfg.model.name if not script else " ".join(script),
                   "data": cfg.data.name if not script else "user", "steps": cfg.job.steps,
                   "skip_first": cfg.log.skip_first, "batch_size": cfg.data.batch_size, "train": config_to_dict(cfg)},
    }
    total = len(nprocs) * args.repeat
    failed = None
    with Progress(TextColumn("bench {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task("", total=total)
        for n in nprocs:
            world = n * nnodes
            runs = []
            for r in range(args.repeat):
                bar.update(task, description=f"{world} process(es), run {r + 1}/{args.repeat}")
                # --timeline costs two clock reads a step; its trace is the report's timeline picture.
                spec = RunSpec(n, [*_run_args(rest, args.scaling, cfg.data.batch_size, nprocs[0], n, world),
                                   "--timeline"],
                               out / "runs" / f"n{world}_r{r}.json", f"run with {world} process(es)", launcher,
                               script)
                doc["commands"].append(spec.shell())
                try:
                    summary = run_train(spec, args.timeout)
                except RunFailed as e:
                    failed = {"nproc": world, "repeat": r + 1, "message": e.detail, "command": spec.shell()}
                    break
                runs.append(summary)
                doc["runs"].append({k: summary.get(k) for k in ("world_size", "samples_per_s", "step_time_s",
                                    "step_time_spread", "data_wait_frac", "rank_compute_s", "rank_step_time_s",
                                    "rank_data_wait_s", "allreduce_calls_per_step", "global_batch", "timeline",
                                    "command")})
                bar.advance(task)
            if failed:
                break  # partial results: the points measured so far stay in bench.json
            doc["points"].append(make_point(n, world, runs))
            if world in forecast:
                doc["points"][-1]["forecast_step_time_s"] = forecast[world]
            complete_points(doc["points"], args.scaling)
            write_json(out / "bench.json", doc)
    doc["error"] = failed
    complete_points(doc["points"], args.scaling)
    doc["verdict"] = bench_verdict(doc["points"], rest, script)
    plots = _plots(doc["points"], doc["runs"], out) if doc["points"] else []
    write_json(out / "bench.json", doc)
    _report(out, doc)
    if doc["points"]:
        console.print(_table(doc["points"], f"trainscale bench ({args.scaling} scaling, "
                                            f"{args.repeat} run(s) per point, medians)"))
    if doc["verdict"]:
        console.print(doc["verdict"]["line"], markup=False, highlight=False)
    console.print(f"wrote {out / 'bench.json'}, {out / 'report.md'}, {out / 'report.html'}"
                  + "".join(f", {out / p}" for p in plots))
    threads = {p["world_size"]: p.get("threads") for p in doc["points"]}
    if len(set(threads.values())) > 1:
        err_console.print("note: threads per process differ between points (" + ", ".join(
            f"{t} at {w}" for w, t in threads.items()) + "); --job.threads T compares like with like")
    if failed:
        err_console.print(f"trainscale bench: run with {failed['nproc']} process(es) failed: {failed['message']}\n"
                          f"  command: {failed['command']}\n  sweep stopped; {len(doc['points'])} point(s) "
                          "measured before it are kept in bench.json", markup=False, highlight=False)
        return 1
    return 0
