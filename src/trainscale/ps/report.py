"""The reports of ``trainscale ps experiment``: each cell's seeds as mean ± standard error with a 95% interval,
tables and plots, written through the lab's report module (Markdown, HTML and PNGs) and a JSON of every seed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..costs.collectives import ps_bytes_at_server, ring_bytes_per_worker, ring_bytes_total
from ..costs.order_stats import sync_async_ratio
from ..reporting import Block, Interval, figure, mean_interval, save, write_json, write_reports

__all__ = ["runtime_cells", "ratio_cells", "convergence_cells", "staleness_rule_effect", "floor_error", "time_to",
           "write_runtime", "write_convergence"]

TARGETS = (0.2, 0.1)  # eval errors whose time to reach the convergence report gives


def _group(runs: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> dict[Any, list[dict[str, Any]]]:
    out: dict[Any, list[dict[str, Any]]] = {}
    for r in runs:
        out.setdefault(key(r), []).append(r)
    return out


def _iv(rows: list[dict[str, Any]], field: str) -> dict[str, float | int | None]:
    return mean_interval(r[field] for r in rows).to_json()


def _pct(iv: dict[str, Any]) -> str:
    return f"{iv['mean']:+.1%} [{iv['lo']:+.0%}, {iv['hi']:+.0%}]" if iv["n"] > 1 else f"{iv['mean']:+.1%}"


def _ms(iv: dict[str, Any]) -> str:
    return Interval(**iv).fmt(1e3)


def _span(iv: dict[str, Any], scale: float = 1e3, digits: int = 0) -> str:
    return f"{iv['lo'] * scale:.{digits}f}–{iv['hi'] * scale:.{digits}f}" if iv["n"] > 1 else "—"


# ------------------------------------------------------------------------------------------------ runtime


def runtime_cells(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One cell per (P, mode): the seeds' seconds per update, errors and overhead as intervals."""
    cells = []
    for (p, mode), rows in _group(runs, lambda r: (r["P"], r["mode"])).items():
        cells.append({"P": p, "mode": mode, "K": rows[0]["K"], "seeds": [r["seed"] for r in rows],
                      "updates": _iv(rows, "updates"), "predicted_s": rows[0]["predicted_s"],
                      "measured_s": _iv(rows, "measured_s"), "error": _iv(rows, "error"),
                      "overhead_s": _iv(rows, "overhead_s"),
                      "predicted_with_overhead_s": _iv(rows, "predicted_with_overhead_s"),
                      "error_with_overhead": _iv(rows, "error_with_overhead"),
                      "bytes_per_update": _iv(rows, "bytes_per_update")})
    return cells


def ratio_cells(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runtime theorem's T_sync / T_async per P: one ratio per seed (its sync and async runs), then the interval."""
    out = []
    for p, rows in sorted(_group(runs, lambda r: r["P"]).items()):
        by_seed = _group(rows, lambda r: r["seed"])
        ratios = [next(r["measured_s"] for r in rs if r["mode"] == "sync") /
                  next(r["measured_s"] for r in rs if r["mode"] == "async")
                  for rs in by_seed.values() if {"sync", "async"} <= {r["mode"] for r in rs}]
        if ratios:
            iv = mean_interval(ratios)
            out.append({"P": p, "ratios": ratios, "ratio": iv.to_json(), "predicted": sync_async_ratio(p),
                        "within": iv.contains(sync_async_ratio(p))})
    return out


def _runtime_plot(path: Path, cells: list[dict[str, Any]], mean: float) -> None:
    """Left: ms per update against P, measured (95% bars) and predicted (dashed); right: measured / predicted.

    The legend sits below both panels so it can cover no curve.
    """
    from matplotlib.ticker import ScalarFormatter

    fig, (left, right) = figure(10.5, 4.8, 1, 2)
    handles = []
    modes = list(dict.fromkeys(c["mode"] for c in cells))
    ps_values = sorted({c["P"] for c in cells})
    for i, mode in enumerate(modes):
        cs = sorted((c for c in cells if c["mode"] == mode), key=lambda c: c["P"])
        xs = [c["P"] * (1 + 0.03 * (i - len(modes) / 2)) for c in cs]  # side by side, so no bar hides another
        ys = [c["measured_s"]["mean"] * 1e3 for c in cs]
        bars = [[max(0.0, (c["measured_s"]["mean"] - c["measured_s"]["lo"]) * 1e3) for c in cs],
                [max(0.0, (c["measured_s"]["hi"] - c["measured_s"]["mean"]) * 1e3) for c in cs]]
        measured = left.errorbar(xs, ys, yerr=bars if cs[0]["measured_s"]["n"] > 1 else None, marker="o", ms=4,
                                 capsize=3, label=f"{mode} measured")
        line = measured[0]
        (predicted,) = left.plot([c["P"] for c in cs], [c["predicted_s"] * 1e3 for c in cs], "--",
                                 color=line.get_color(), alpha=0.6, label=f"{mode} predicted")
        handles += [measured, predicted]  # one legend column per mode: measured above predicted
        err = [[max(0.0, c["error"]["mean"] - c["error"]["lo"]) for c in cs],
               [max(0.0, c["error"]["hi"] - c["error"]["mean"]) for c in cs]]
        right.errorbar(xs, [1 + c["error"]["mean"] for c in cs], yerr=err if cs[0]["error"]["n"] > 1 else None,
                       marker="o", ms=4, capsize=3, color=line.get_color())
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ps_values, [str(p) for p in ps_values])
        ax.set_xlabel("P (learners)")
    left.set(yscale="log", ylabel="ms per update", title=f"time per update, delays Exp(mean {mean * 1e3:.0f} ms)")
    left.yaxis.set_major_formatter(ScalarFormatter())
    left.yaxis.set_minor_formatter(ScalarFormatter())
    right.axhline(1.0, color="gray", lw=1)
    right.set(ylabel="measured / predicted", title="measured / order-statistics prediction")
    fig.legend(handles, [h.get_label() for h in handles], loc="lower center", ncol=len(modes), fontsize=7,
               frameon=False)
    save(fig, path, legend_below=0.1)


def write_runtime(out: Path, runs: list[dict[str, Any]], settings: dict[str, Any], n_bytes: int) -> dict[str, Any]:
    """Write runtime.md, runtime.html, runtime.json (every seed's run and the cells) and runtime.png."""
    out.mkdir(parents=True, exist_ok=True)
    cells, ratios = runtime_cells(runs), ratio_cells(runs)
    mean = settings["mean_s"]
    _runtime_plot(out / "runtime.png", cells, mean)
    table = [[c["P"], c["mode"], c["K"], f"{c['updates']['mean']:.0f}", f"{c['predicted_s'] * 1e3:.1f}",
              _ms(c["measured_s"]), _span(c["measured_s"]), _pct(c["error"]), _ms(c["overhead_s"]),
              f"{c['predicted_with_overhead_s']['mean'] * 1e3:.1f}", _pct(c["error_with_overhead"])] for c in cells]
    ratio_rows = [[r["P"], ", ".join(f"{x:.2f}" for x in r["ratios"]), Interval(**r["ratio"]).fmt(digits=2),
                   _span(r["ratio"], 1, 2), f"{r['predicted']:.2f}", "yes" if r["within"] else "no"] for r in ratios]
    comm = []
    for c in cells:
        if c["mode"] == "sync":
            per, total = ring_bytes_per_worker(n_bytes, c["P"]), ring_bytes_total(n_bytes, c["P"])
            comm.append([c["P"], f"{c['bytes_per_update']['mean'] / 1e6:.3f}", f"{ps_bytes_at_server(n_bytes, c['P']) / 1e6:.3f}",
                         f"{per / 1e6:.3f}", f"{total / 1e6:.3f}"])
    n = len(settings["seeds"])
    blocks: list[Block] = [
        ("pre", settings["command"]),
        ("p", f"Mini-batch times are the learners' (tiny) compute plus an exponential delay with mean "
              f"{mean * 1e3:.0f} ms (--ps.delay exp:MEAN), so the order statistics of Dutta et al. (AISTATS 2018) should describe them. "
              "Predictions: sync H_P·mean, k-sync and k-async (H_P − H_{P−K})·mean, async mean/P, k-batch modes "
              f"K·mean/P; K = P/2. Each cell ran with {n} seeds (--job.seed {', '.join(map(str, settings['seeds']))}: "
              "delays, data order, initial model), all cells of one seed before the next seed, so a slow spell of "
              "this shared machine spreads over the cells instead of landing on one; each run lasts about "
              f"{settings['seconds']:g} s and at least {settings['min_updates']} updates. Measured: mean ± standard "
              "error over the seeds, with the 95% Student-t interval; errors are the mean of each seed's "
              "measured / predicted − 1, with their 95% interval in brackets."),
        ("p", "\"overhead c\" is measured in the same run: each mini-batch's time from launch to the coordinator "
              "seeing its result, minus its injected delay (launch, parameter fetch, compute, push, scheduling on "
              "this machine). \"predicted with c\" takes mini-batch times c + Exp(mean): c adds to every order "
              "statistic (k-sync pays it every update; k-async only for the K restarted learners, an "
              "approximation) and to the cycle of the always-busy modes."),
        ("table", ["P", "mode", "K", "updates", "predicted ms", "measured ms", "95% interval ms", "error [95%]",
                   "overhead c ms", "predicted with c ms", "error vs c [95%]"], table),
        ("img", "runtime.png", "Left: time per update, mean of the seeds with 95% intervals, against the "
                               "prediction (dashed). Right: measured / predicted with 95% intervals."),
        ("h2", "The runtime theorem (Dutta et al., AISTATS 2018): E[T_sync] / E[T_async] = P·E[X_P:P]/E[X] = P·H_P"),
        ("p", "One ratio per seed (that seed's sync and async runs), then their mean ± standard error and 95% "
              "interval; \"within\" says whether P·H_P lies in that interval."),
        ("table", ["P", "ratio per seed", "measured ratio", "95% interval", "predicted P·H_P", "within"], ratio_rows),
        ("h2", "Communication per synchronous update (float32 gradients of N bytes)"),
        ("p", f"N = {n_bytes / 1e6:.3f} MB. Through the server every learner pushes N and pulls N: 2NP bytes cross "
              "the server's link each update. A ring all-reduce of the same gradients moves 2N(P−1)/P per learner, "
              "2N(P−1) over all links, and no single link carries more than 2N(P−1)/P."),
        ("table", ["P", "measured through PS, MB/update", "PS 2NP MB", "ring per learner 2N(P−1)/P MB",
                   "ring all links 2N(P−1) MB"], comm),
    ]
    title = "Parameter server: time per update against order statistics"
    md, _ = write_reports(out, "runtime", title, blocks)
    doc = {**settings, "model_bytes": n_bytes, "runs": runs, "cells": cells, "sync_async": ratios}
    write_json(out / "runtime.json", doc)
    return {**doc, "markdown": md.read_text()}


# ------------------------------------------------------------------------------------------------ convergence


def floor_error(curve: list[dict[str, float]], frac: float = 0.25) -> float:
    """Mean eval error over the last ``frac`` of the curve (the floor it settles at)."""
    tail = curve[-max(1, int(len(curve) * frac)):]
    return sum(1 - c["accuracy"] for c in tail) / len(tail) if tail else float("nan")


def time_to(curve: list[dict[str, float]], error: float) -> float | None:
    """Seconds until the eval error first reaches ``error`` (None if it never does)."""
    return next((c["t"] for c in curve if 1 - c["accuracy"] <= error), None)


def convergence_cells(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One cell per run label (mode and rate rule): the seeds' updates, staleness, times to targets and floors."""
    cells = []
    for label, rows in _group(runs, lambda r: r["label"]).items():
        reach = {str(t): [x for x in (time_to(r["curve"], t) for r in rows) if x is not None] for t in TARGETS}
        cells.append({"label": label, "mode": rows[0]["mode"], "lr_rule": rows[0]["lr_rule"], "K": rows[0]["K"],
                      "seeds": [r["seed"] for r in rows], "updates": _iv(rows, "updates"),
                      "staleness_mean": _iv(rows, "staleness_mean"),
                      "time_to": {t: {**mean_interval(xs).to_json(), "reached": len(xs)} for t, xs in reach.items()},
                      "floor": mean_interval(floor_error(r["curve"]) for r in rows).to_json(),
                      "final_error": mean_interval(1 - r["eval_accuracy"] for r in rows).to_json()})
    return cells


def _on_grid(curve: list[dict[str, float]], key: str, grid: list[float]) -> list[float]:
    """The eval error at each grid point: the last evaluation at or before it (the first one before any)."""
    out, i = [], 0
    for g in grid:
        while i + 1 < len(curve) and curve[i + 1][key] <= g:
            i += 1
        out.append(1 - curve[i]["accuracy"])
    return out


def _band(rows: list[dict[str, Any]], key: str, grid: list[float]) -> tuple[list[float], list[float], list[float]]:
    """Mean, lowest and highest error of the seeds at each grid point."""
    ys = [_on_grid(r["curve"], key, grid) for r in rows]
    cols = list(zip(*ys))
    return [sum(c) / len(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


def _grid(rows: list[dict[str, Any]], key: str, log: bool, n: int = 120) -> list[float]:
    lo = max(min(c[key] for c in r["curve"]) for r in rows)
    hi = min(max(c[key] for c in r["curve"]) for r in rows)  # where every seed has a value
    lo = max(lo, 1e-9) if log else lo
    if log:
        return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def _convergence_plot(path: Path, runs: list[dict[str, Any]], key: str, xlabel: str, log_x: bool,
                      title: str) -> None:
    """One panel per run label: the seeds' mean error with a band from the lowest to the highest seed, the first
    label's mean in grey for reference, and the target errors as dotted lines."""
    groups = {k: v for k, v in _group(runs, lambda r: r["label"]).items() if all(r["curve"] for r in v)}
    if not groups:
        return
    cols = min(3, len(groups))
    rows_n = (len(groups) + cols - 1) // cols
    fig, axes = figure(3.6 * cols, 2.9 * rows_n + 0.4, rows_n, cols, sharex=True, sharey=True)
    axes = axes if isinstance(axes, list) else [axes]
    ref_label, ref_rows = next(iter(groups.items()))
    ref_grid = _grid(ref_rows, key, log_x)
    ref_mean = _band(ref_rows, key, ref_grid)[0]
    for ax, (label, rows) in zip(axes, groups.items()):
        grid = _grid(rows, key, log_x)
        mean, lo, hi = _band(rows, key, grid)
        if label != ref_label:
            ax.plot(ref_grid, ref_mean, color="gray", lw=1, alpha=0.7, label=f"{ref_label} (mean)")
        ax.fill_between(grid, lo, hi, alpha=0.25, step="post", label=f"seeds' range (n={len(rows)})")
        ax.plot(grid, mean, drawstyle="steps-post", lw=1.6, label="mean of the seeds")
        for t in TARGETS:
            ax.axhline(t, color="black", ls=":", lw=0.8)
        ax.set_title(label, fontsize=9)
        ax.set_yscale("log")
        if log_x:
            ax.set_xscale("log")
    for ax in axes[len(groups):]:
        ax.set_visible(False)
    for ax in axes[-cols:]:
        ax.set_xlabel(xlabel)
    for ax in axes[::cols]:
        ax.set_ylabel("eval error")
    handles, labels = axes[1 if len(groups) > 1 else 0].get_legend_handles_labels()
    fig.suptitle(title + f"; dotted: errors {' and '.join(map(str, TARGETS))}", fontsize=10)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    save(fig, path, legend_below=0.09)


def _reach(iv: dict[str, Any], n: int) -> str:
    if not iv["reached"]:
        return f"never (0/{n})"
    text = Interval(**{k: iv[k] for k in ("mean", "se", "lo", "hi", "n")}).fmt(digits=2)
    return text if iv["reached"] == n else f"{text} ({iv['reached']}/{n} reached)"


def staleness_rule_effect(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per asynchronous mode: the staleness rule's floor minus the constant rate's, paired by seed, as an interval."""
    out = []
    for mode, rows in _group([r for r in runs if r["mode"] in ("async", "k-async")], lambda r: r["mode"]).items():
        by_seed = _group(rows, lambda r: r["seed"])
        diffs = [floor_error(next(r for r in rs if r["lr_rule"] == "staleness")["curve"])
                 - floor_error(next(r for r in rs if r["lr_rule"] == "constant")["curve"])
                 for rs in by_seed.values() if {"staleness", "constant"} <= {r["lr_rule"] for r in rs}]
        if diffs:
            out.append({"mode": mode, "diffs": diffs, "difference": mean_interval(diffs).to_json()})
    return out


def write_convergence(out: Path, runs: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """Write convergence.md, .html, .json (every seed's curve and the cells) and the two PNGs."""
    out.mkdir(parents=True, exist_ok=True)
    cells, effect = convergence_cells(runs), staleness_rule_effect(runs)
    n = len(settings["seeds"])
    title = f"digits, P = {settings['learners']}, delays exp:{settings['mean_s']}"
    _convergence_plot(out / "convergence_time.png", runs, "t", "seconds", False, title)
    _convergence_plot(out / "convergence_updates.png", runs, "update", "server updates", True, title)
    rows = [[c["label"], c["K"], Interval(**c["updates"]).fmt(digits=0), Interval(**c["staleness_mean"]).fmt(digits=2),
             *(_reach(c["time_to"][str(t)], n) for t in TARGETS), Interval(**c["floor"]).fmt(digits=3),
             _span(c["floor"], 1, 3), Interval(**c["final_error"]).fmt(digits=3)] for c in cells]
    eff_rows = [[e["mode"], ", ".join(f"{d:+.3f}" for d in e["diffs"]), f"{e['difference']['mean']:+.3f} ± {e['difference']['se']:.3f}",
                 _span(e["difference"], 1, 3)] for e in effect]
    blocks: list[Block] = [
        ("pre", settings["command"]),
        ("p", f"{settings['learners']} learners, exponential delays with mean {settings['mean_s'] * 1e3:.0f} ms, "
              f"{settings['seconds']:g} s of wall-clock per run, the same base learning rate everywhere, {n} seeds "
              f"per run (--job.seed {', '.join(map(str, settings['seeds']))}), every run of one seed before the "
              "next seed; eval error on digits' 297 held-out images every 5 updates. The staleness rule divides "
              "the rate of each gradient by its staleness (Zhang et al. 2016). Values: mean ± standard "
              "error over the seeds; the floor's 95% Student-t interval beside it."),
        ("table", ["run", "K", "updates", "mean staleness", *(f"s to error {t}" for t in TARGETS),
                   "floor (last quarter)", "floor 95% interval", "final error"], rows),
        ("img", "convergence_time.png", "Eval error against wall-clock, one panel per run: mean of the seeds, "
                                        "band from the lowest to the highest seed, sync's mean in grey"),
        ("img", "convergence_updates.png", "Eval error against server updates, the same panels"),
        ("h2", "Does the staleness rule help?"),
        ("p", "The floor with --lr-rule staleness minus the floor with a constant rate, paired by seed (negative: "
              "the rule helps); an interval that holds 0 means no difference was measured."),
        ("table", ["mode", "difference per seed", "mean difference", "95% interval"], eff_rows),
    ]
    md, _ = write_reports(out, "convergence", "Parameter server: convergence of the synchronisation policies", blocks)
    doc = {**settings, "runs": runs, "cells": cells, "staleness_rule": effect}
    write_json(out / "convergence.json", doc)
    return {**doc, "markdown": md.read_text()}
