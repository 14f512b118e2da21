"""``trainscale ps experiment runtime|convergence``: seed 002's pictures, measured on this machine.

* runtime: mean time per update of each mode under exponential delays, against the order-statistics
  predictions of :mod:`.theory`, for several P; the sync/async ratio against P * H_P; and the bytes per
  update through the server against a ring all-reduce of the same gradients.
* convergence: eval error on digits against wall-clock and against updates for sync, k-sync, async and
  k-async, the asynchronous ones with and without the staleness rule.

Each writes ``<out>/<name>.md``, ``<out>/<name>.json`` and PNG plots; one Ray instance and one set of
actors serve all the runs of an experiment.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from ..config import ConfigError, load_config
from ..log import logger, setup_logging
from .theory import predicted_update_time, ps_bytes, ring_bytes, sync_async_ratio

__all__ = ["main", "runtime_experiment", "convergence_experiment"]

RUNTIME_MODES = ("sync", "k-sync", "async", "k-async", "k-batch-sync", "k-batch-async")
CONVERGENCE_RUNS = (("sync", "constant"), ("k-sync", "constant"), ("async", "constant"), ("async", "staleness"),
                    ("k-async", "constant"), ("k-async", "staleness"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainscale ps experiment",
                                description="Measure seed 002's parameter-server claims and write a report.")
    p.add_argument("kind", choices=("runtime", "convergence"))
    p.add_argument("--out", default="", help="report folder (default: ps-<kind>)")
    p.add_argument("--learners", default="", help="comma-separated P values (runtime: 2,4,8; convergence: 4)")
    p.add_argument("--modes", default="", help="comma-separated modes (runtime only)")
    p.add_argument("--mean", type=float, default=0.0, help="mean of the exponential delay, seconds "
                                                         "(runtime: 0.3; convergence: 0.02)")
    p.add_argument("--seconds", type=float, default=0.0, help="runtime: target seconds per run; "
                                                            "convergence: wall-clock of each run (default 25 / 20)")
    p.add_argument("--min-updates", type=int, default=100, help="runtime: fewest updates per run")
    p.add_argument("--max-updates", type=int, default=600, help="runtime: most updates per run")
    p.add_argument("--ray-address", default=None, help="join a running Ray cluster")
    return p


def main(argv: list[str]) -> int:
    """Entry of ``trainscale ps experiment``; extra ``--section.field value`` set the runs' configuration."""
    args, rest = _parser().parse_known_args(argv)
    base = load_config(rest)  # validates the overrides before Ray starts
    setup_logging(base.log.level, rank=0)
    out = Path(args.out or f"ps-{args.kind}")
    try:
        ps_values = [int(x) for x in args.learners.split(",")] if args.learners else None
    except ValueError:
        raise ConfigError("--learners", args.learners, "comma-separated integers, e.g. 2,4,8") from None
    from .record import PsError
    from .session import ray_session

    try:
        result = _run(args, out, rest, ps_values)
    except PsError as e:
        print(f"trainscale ps experiment: {e}", file=sys.stderr)
        return 1
    print(result["markdown"])
    print(f"report: {out / (args.kind + '.md')}")
    return 0


def _run(args: argparse.Namespace, out: Path, rest: list[str], ps_values: list[int] | None) -> dict[str, Any]:
    from .session import ray_session

    with ray_session(args.ray_address):
        if args.kind == "runtime":
            modes = tuple(args.modes.split(",")) if args.modes else RUNTIME_MODES
            result = runtime_experiment(out, rest, ps_values or [2, 4, 8], modes, args.mean or 0.3,
                                        args.seconds or 25.0, args.min_updates, args.max_updates)
        else:
            result = convergence_experiment(out, rest, (ps_values or [4])[0], args.mean or 0.02, args.seconds or 20.0)
    return result


# ------------------------------------------------------------------------------------------------ runtime


def runtime_experiment(out: Path, overrides: list[str], learners: list[int], modes: tuple[str, ...], mean: float,
                       seconds: float, min_updates: int, max_updates: int, actors: Any = None) -> dict[str, Any]:
    """Measure seconds per update of each mode and P under ``exp:mean`` delays; write the report.

    ``actors`` (a PsActors with enough learners) is reused when given, else made and ended here.
    """
    from .actors import PsActors
    from .job import preflight, run_ps

    for m in modes:
        if m not in RUNTIME_MODES:
            raise ConfigError("--modes", m, "one of " + ", ".join(RUNTIME_MODES))
    rows: list[dict[str, Any]] = []
    own = actors is None
    actors = actors or PsActors(max(learners), 1)
    try:
        for p in learners:
            for mode in modes:
                k = 1 if mode == "async" else (p if mode == "sync" else max(1, p // 2))
                predicted = predicted_update_time(mode, p, k, mean)
                n = int(min(max_updates, max(min_updates, math.ceil(seconds / predicted))))
                cfg = load_config([*_SMALL, *overrides, "--ps.mode", mode, "--ps.learners", str(p), "--ps.k", str(k),
                                   "--ps.delay", f"exp:{mean}", "--ps.steps", str(n), "--log.progress", "none"])
                s = run_ps(cfg, actors=actors, plan=preflight(cfg))
                measured = s["mean_update_interval_s"]
                c = s["minibatch_overhead_s"] or 0.0
                with_c = predicted_update_time(mode, p, k, mean, shift=c)
                rows.append({"P": p, "mode": mode, "K": k, "updates": s["updates"], "predicted_s": predicted,
                             "measured_s": measured, "error": measured / predicted - 1, "overhead_s": c,
                             "predicted_with_overhead_s": with_c, "error_with_overhead": measured / with_c - 1,
                             "bytes_per_update": (s["bytes_pushed"] + s["bytes_pulled"]) / max(1, s["updates"]),
                             "staleness_mean": s["staleness_mean"], "wall_s": s["wall_s"]})
                logger.info(f"runtime: P={p} {mode:<13} K={k}  measured {measured * 1e3:7.1f} ms  predicted "
                            f"{predicted * 1e3:7.1f} ms  ({rows[-1]['error']:+.1%}); overhead c {c * 1e3:.1f} ms, "
                            f"with c {with_c * 1e3:.1f} ms ({rows[-1]['error_with_overhead']:+.1%})")
    finally:
        if own:
            actors.close()
    numel = sum(p.numel() for p in preflight(load_config([*_SMALL, *overrides])).model.parameters())
    return _write_runtime(out, rows, mean, numel * 4)


_SMALL = ["--model.width", "64"]  # delays dominate; a small model keeps 8 learners within 2 cores


def _write_runtime(out: Path, rows: list[dict[str, Any]], mean: float, n_bytes: int) -> dict[str, Any]:
    from .report import line_plot, md_table, write_report

    table = md_table(["P", "mode", "K", "updates", "predicted ms", "measured ms", "error", "overhead c ms",
                      "predicted with c ms", "error vs c"],
                     [[r["P"], r["mode"], r["K"], r["updates"], f"{r['predicted_s'] * 1e3:.1f}",
                       f"{r['measured_s'] * 1e3:.1f}", f"{r['error']:+.1%}", f"{r['overhead_s'] * 1e3:.1f}",
                       f"{r['predicted_with_overhead_s'] * 1e3:.1f}", f"{r['error_with_overhead']:+.1%}"]
                      for r in rows])
    ratios = []
    for p in sorted({r["P"] for r in rows}):
        by = {r["mode"]: r for r in rows if r["P"] == p}
        if "sync" in by and "async" in by:
            ratios.append([p, f"{by['sync']['measured_s'] / by['async']['measured_s']:.2f}",
                           f"{sync_async_ratio(p):.2f}"])
    comm = []
    for r in rows:
        if r["mode"] == "sync":
            per, total = ring_bytes(n_bytes, r["P"])
            comm.append([r["P"], f"{r['bytes_per_update'] / 1e6:.3f}", f"{ps_bytes(n_bytes, r['P']) / 1e6:.3f}",
                         f"{per / 1e6:.3f}", f"{total / 1e6:.3f}"])
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    series = {m: ([r["P"] for r in rows if r["mode"] == m], [r["measured_s"] * 1e3 for r in rows if r["mode"] == m])
              for m in modes}
    predicted = {m + " (predicted)": ([r["P"] for r in rows if r["mode"] == m],
                                      [r["predicted_s"] * 1e3 for r in rows if r["mode"] == m]) for m in modes}
    line_plot(out / "runtime.png", "P (learners)", "ms per update", series, dashed=predicted, logy=True,
              title=f"time per update, exponential delays (mean {mean * 1e3:.0f} ms)")
    sections = [
        f"Mini-batch times are the learners' (tiny) compute plus an exponential delay with mean {mean * 1e3:.0f} ms "
        "(`--ps.delay exp:MEAN`), so the order statistics of seed 002 should describe them. Predictions: sync "
        "H_P·mean, k-sync and k-async (H_P − H_{P−K})·mean, async mean/P, k-batch modes K·mean/P; K = P/2. "
        "\"overhead c\" is measured in the same run: each mini-batch's time from launch to the coordinator "
        "seeing its result, minus its injected delay (launch, parameter fetch, compute, push, scheduling on this "
        "machine). \"predicted with c\" takes mini-batch times c + Exp(mean): c adds to every order statistic "
        "(k-sync pays it every update; k-async only for the K restarted learners, an approximation) and to the "
        "cycle of the always-busy modes.",
        table, "![time per update](runtime.png)",
        "## Seed 002's theorem: E[T_sync] / E[T_async] = P·E[X_P:P]/E[X] = P·H_P\n\n"
        + md_table(["P", "measured ratio", "predicted P·H_P"], ratios),
        "## Communication per synchronous update (float32 gradients of N bytes)\n\n"
        f"N = {n_bytes / 1e6:.3f} MB. Through the server every learner pushes N and pulls N: 2NP bytes cross the "
        "server's link each update. A ring all-reduce of the same gradients moves 2N(P−1)/P per learner, "
        "2N(P−1) over all links, and no single link carries more than 2N(P−1)/P.\n\n"
        + md_table(["P", "measured through PS, MB/update", "PS 2NP MB", "ring per learner 2N(P−1)/P MB",
                    "ring all links 2N(P−1) MB"], comm),
    ]
    md = write_report(out, "runtime", "Parameter server: time per update against order statistics", sections,
                      {"mean_s": mean, "rows": rows, "model_bytes": n_bytes})
    return {"rows": rows, "markdown": md}


# ------------------------------------------------------------------------------------------------ convergence


def convergence_experiment(out: Path, overrides: list[str], learners: int, mean: float, seconds: float,
                           actors: Any = None) -> dict[str, Any]:
    """Eval error against time and updates for the modes of seed 002's picture; write the report."""
    from .actors import PsActors
    from .job import preflight, run_ps

    runs: list[dict[str, Any]] = []
    own = actors is None
    actors = actors or PsActors(learners, 1)
    try:
        for mode, rule in CONVERGENCE_RUNS:
            k = max(1, learners // 2)
            cfg = load_config(["--ps.lr", "0.2", *_SMALL, *overrides, "--ps.mode", mode, "--ps.learners",
                               str(learners), "--ps.k", str(k), "--ps.lr_rule", rule, "--ps.delay", f"exp:{mean}",
                               "--ps.time_s", str(seconds), "--ps.eval_every", "5", "--log.progress", "none"])
            s = run_ps(cfg, actors=actors, plan=preflight(cfg))
            label = f"{mode} ({rule})" if rule != "constant" else mode
            runs.append({"label": label, "mode": mode, "lr_rule": rule, "K": s["k"], "updates": s["updates"],
                         "staleness_mean": s["staleness_mean"], "eval_accuracy": s["eval_accuracy"],
                         "curve": s["eval_curve"]})
            logger.info(f"convergence: {label:<22} {s['updates']} updates, staleness {s['staleness_mean']:.2f}, "
                        f"eval accuracy {s['eval_accuracy']:.3f}")
    finally:
        if own:
            actors.close()
    return _write_convergence(out, runs, learners, mean, seconds)


def _floor(curve: list[dict[str, float]], frac: float = 0.25) -> float:
    """Mean eval error over the last ``frac`` of the curve (the floor it settles at)."""
    tail = curve[-max(1, int(len(curve) * frac)):]
    return sum(1 - c["accuracy"] for c in tail) / len(tail) if tail else float("nan")


def _time_to(curve: list[dict[str, float]], error: float) -> float | None:
    return next((c["t"] for c in curve if 1 - c["accuracy"] <= error), None)


def _write_convergence(out: Path, runs: list[dict[str, Any]], learners: int, mean: float, seconds: float
                       ) -> dict[str, Any]:
    from .report import line_plot, md_table, write_report

    by_time = {r["label"]: ([c["t"] for c in r["curve"]], [1 - c["accuracy"] for c in r["curve"]]) for r in runs}
    by_update = {r["label"]: ([c["update"] for c in r["curve"]], [1 - c["accuracy"] for c in r["curve"]])
                 for r in runs}
    line_plot(out / "convergence_time.png", "seconds", "eval error", by_time, logy=True,
              title=f"digits, P = {learners}, delays exp:{mean}")
    line_plot(out / "convergence_updates.png", "server updates", "eval error", by_update, logy=True, logx=True,
              title=f"digits, P = {learners}, delays exp:{mean}")
    rows = [[r["label"], r["K"], r["updates"], f"{r['staleness_mean']:.2f}",
             _fmt(_time_to(r["curve"], 0.2)), _fmt(_time_to(r["curve"], 0.1)), f"{_floor(r['curve']):.3f}",
             f"{1 - r['eval_accuracy']:.3f}"] for r in runs]
    sections = [
        f"{learners} learners, exponential delays with mean {mean * 1e3:.0f} ms, {seconds:g} s of wall-clock per run, "
        "the same base learning rate everywhere; eval error on digits' 297 held-out images every 5 updates. "
        "The staleness rule divides the rate of each gradient by its staleness (seed 002, Zhang et al. 2016).",
        md_table(["run", "K", "updates", "mean staleness", "s to error 0.2", "s to error 0.1",
                  "floor (last quarter)", "final error"], rows),
        "![error against time](convergence_time.png)\n\n![error against updates](convergence_updates.png)",
    ]
    md = write_report(out, "convergence", "Parameter server: convergence of the synchronisation policies", sections,
                      {"learners": learners, "mean_s": mean, "seconds": seconds, "runs": runs})
    return {"runs": runs, "markdown": md}


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"
