"""The doctor's rendering: the console table and lines, the Markdown/HTML report and its plots, from doctor.json.

Pure presentation: everything here reads the result the analysis wrote; nothing decides or measures.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

from rich.console import JustifyMethod
from rich.table import Table

from ..reporting import figure, save, write_reports
from ..reporting.console import console
from .analysis import CONFIGS
from .neighbours import describe
from .ranks import plot_ranks
from .stats import median

__all__ = ["PLOTS", "write_report", "write_plots", "print_result", "bottleneck_first"]

PLOTS = ("causes.png", "experiments.png", "ranks.png")


def _table(res: dict[str, Any]) -> Table:
    t = Table(title=f"trainscale doctor: scaling loss {res['scaling_loss_s'] * 1e3:+.3f} ms/step "
                    f"(1 -> {res['nproc']} processes, efficiency {res['efficiency']:.0%})", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("#", "right"), ("cause", "left"), ("ms/step", "right"), ("share", "right"), ("90% interval ms", "right"),
        ("verdict", "left"))
    for col, j in columns:
        t.add_column(col, justify=j)
    for i, c in enumerate(res["causes"], 1):
        v = c["seconds_per_step"]
        t.add_row(str(i) if c["significant"] else "-", c["name"] + (f" (rank {c['rank']})" if c["name"] ==
                  "straggler" and c["verdict"] != "no" else ""),
                  f"{v * 1e3:+.3f}" if math.isfinite(v) else "-",
                  f"{c['share']:.0%}" if math.isfinite(c["share"]) else "-", _interval_ms(c), c["verdict"])
    return t


def _interval_ms(c: dict[str, Any]) -> str:
    lo, hi = c.get("interval_s") or (float("nan"), float("nan"))
    return f"{lo * 1e3:+.2f} .. {hi * 1e3:+.2f}" if math.isfinite(lo) and math.isfinite(hi) else "-"


def write_plots(res: dict[str, Any], lab_log: list[dict[str, Any]], runs: dict[tuple[str, int], list[dict[str, Any]]],
           out: Path, n: int) -> None:
    causes = [c for c in res["causes"] if math.isfinite(c["seconds_per_step"])]
    fig, ax = figure(6.5, 3.8)
    names = [c["name"] for c in causes][::-1]
    vals = [c["seconds_per_step"] * 1e3 for c in causes][::-1]
    # Error bars: the cause's 90% interval (asymmetric), else its noise.
    lo = [(c["seconds_per_step"] - (c.get("interval_s") or [c["seconds_per_step"] - c["noise_s"]])[0]) * 1e3
          for c in causes][::-1]
    hi = [((c.get("interval_s") or [0, c["seconds_per_step"] + c["noise_s"]])[1] - c["seconds_per_step"]) * 1e3
          for c in causes][::-1]
    errs = [[max(0.0, x) if math.isfinite(x) else 0.0 for x in v] for v in (lo, hi)]
    colors = ["C3" if c["significant"] else "0.7" for c in causes][::-1]
    ax.barh(names, vals, xerr=errs, color=colors, capsize=3)
    ax.axvline(res["scaling_loss_s"] * 1e3, ls="--", color="k", label="scaling loss T_N - T_1")
    ax.set(xlabel="ms per step (median; error bar: 90% interval)", title="Causes of the scaling loss (red: clear)")
    ax.legend(fontsize=8)
    save(fig, out / PLOTS[0])
    fig, ax = figure(6.5, 3.6)
    exps = [e for e in CONFIGS if any(r["experiment"] == e for r in lab_log)]
    for j, k in enumerate((1, n)):
        per = [[r["job_step_time_s"] * 1e3 for r in lab_log if r["experiment"] == e and r["nproc"] == k]
               for e in exps]
        ys = [median(v) for v in per]
        err = [[y - min(v) for y, v in zip(ys, per)], [max(v) - y for y, v in zip(ys, per)]]
        ax.bar([i + (j - 0.5) * 0.38 for i in range(len(exps))], ys, width=0.38, yerr=err, capsize=3,
               label=f"{k} process(es)")
    ax.set_xticks(range(len(exps)), exps)
    ax.set(ylabel="ms per step (median; bar: range over runs)",
           title="Experiments: each removes one more part of the step")
    ax.legend(fontsize=8)
    save(fig, out / PLOTS[1])
    plot_ranks(runs[("base", n)], runs[("base", 1)], n, out / PLOTS[2],
               f"Per rank: where the step goes at {n} processes (base phase)")


def _superlinear(res: dict[str, Any]) -> str:
    """An efficiency above 100% is never printed without saying what it can mean."""
    if not res["efficiency"] > 1.0:
        return ""
    return (" Efficiency above 100%: N processes did more than N times the work of one. With equal threads per "
            "process this is real only from cache effects (each process's share of the data fits a faster level); "
            "otherwise the 1-process run was slowed by something the N-process runs escaped (see the outside load).")


def _external_text(ext: dict[str, Any]) -> str:
    top = ", ".join(describe(p) for p in ext.get("top", [])[:4]) or "none"
    gpu = f"; other processes on the GPUs: {ext['gpu_users']}" if ext.get("gpu_users") else ""
    return (f"Outside the job, while its runs went: {ext['cores']:.2f} of {ext['machine_cores']} cores busy "
            f"(top: {top}){gpu}.")


def _sureness(res: dict[str, Any]) -> str:
    st = res.get("statistics", {})
    undecided = [c["name"] for c in res["causes"] if c["verdict"] == "undecided"]
    return (f"How sure: {st.get('method', '?')}, {st.get('replicates', 0)} replicates, {res['repeats']} repeat(s), "
            f"{res.get('budget_used_s', 0):.0f} s of a {res.get('budget_s', 0):.0f} s budget; {st.get('outlier_steps', 0)} "
            f"step(s) over 10x their phase's median (kept; medians ignore them). "
            + (f"Undecided: {', '.join(undecided)}." if undecided else "No cause left undecided."))


def _change(doc: dict[str, Any], top: dict[str, Any]) -> str:
    """The top cause's change as a command to copy: the job with the suggested flags, or the advice itself."""
    flags = [x for k, v in top["apply_flags"].items() for x in (f"--{k}", v)]
    if not flags:
        return top["suggestion"]
    cfg, n = doc["config"], doc["config"]["nproc"]
    if cfg.get("script"):
        return (f"TRAINSCALE_ARGS={shlex.quote(shlex.join(flags))} trainscale launch --nproc-per-node {n} "
                + shlex.join(cfg["script"]))
    # The job's own setting of a changed field goes, so the command says each field once.
    args, keep, skip = cfg["train_args"], [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name.lstrip("-") in top["apply_flags"]:
            skip = "=" not in a and i + 1 < len(args)
            continue
        keep.append(a)
    return shlex.join(["trainscale", "train", "--nproc", str(n), *keep, *flags])


def bottleneck_first(doc: dict[str, Any]) -> bool:
    """Whether what bounds the step matters more to the user than the scaling loss: no clear scaling cause, or
    the bounding part takes more of the N-process step than the whole scaling loss does."""
    b = doc.get("bottleneck") or {}
    if not b.get("name") or not math.isfinite(b.get("share", math.nan)):
        return False
    top = next((c for c in doc["causes"] if c["significant"]), None)
    loss_share = doc["scaling_loss_s"] / doc["step_time_n_s"] if doc.get("step_time_n_s") else 0.0
    return top is None or b["share"] > loss_share


def _bottleneck_line(doc: dict[str, Any]) -> str:
    b = doc["bottleneck"]
    return (f"What bounds the step at {b['nproc']} processes: {b['name'].replace('_', ' ')}, {b['share']:.0%} of it "
            f"({b['evidence']}). {b['advice'][:1].upper()}{b['advice'][1:]}.")


def _headline(doc: dict[str, Any]) -> list[tuple]:
    """The report's opening: what matters more first (the bound on the step, or the top scaling cause with its
    share and interval), then the other, the change to copy, the applied verdict."""
    blocks = _scaling_headline(doc)
    if doc.get("bottleneck", {}).get("name"):
        line = ("p", _bottleneck_line(doc))
        blocks = [line, *blocks] if bottleneck_first(doc) else [*blocks, line]
    if doc.get("unexplained_beyond_noise"):
        blocks.append(("p", f"Unexplained: {doc['unexplained_s'] * 1e3:+.3f} ms/step of the scaling loss is in no "
                            "cause (the causes' medians do not add up exactly, or a cost none of the experiments "
                            "isolates)."))
    if doc.get("apply") and doc["apply"].get("decision"):
        blocks.append(("p", f"Applied: {doc['apply']['text']}"))
    return blocks


def _scaling_headline(doc: dict[str, Any]) -> list[tuple]:
    """The scaling verdict: the top cause with its share and interval and the change to copy, or that none is clear."""
    top = next((c for c in doc["causes"] if c["significant"]), None)
    if top is None:
        likely = [c["name"] for c in doc["causes"] if c["verdict"] in ("likely", "undecided")]
        blocks = [("p", f"Verdict: no cause is clear above the measured noise (scaling loss "
                        f"{doc['scaling_loss_s'] * 1e3:+.3f} ms/step, efficiency {doc['efficiency']:.0%})."
                        + (f" Not decided yet: {', '.join(likely)}; raise --repeat or --budget." if likely else
                           " Nothing to change for scaling."))]
    else:
        name = top["name"] + (f" (rank {top['rank']})" if top["name"] == "straggler" else "")
        # No loss (a job that scales superlinearly) leaves nothing to take a share of: say so, never "nan%".
        share = (f"{top['share']:.0%} of the scaling loss" if math.isfinite(top["share"]) else
                 f"with no scaling loss to share (efficiency {doc['efficiency']:.0%})")
        blocks = [("p", f"Verdict: {name} costs {top['seconds_per_step'] * 1e3:+.3f} ms/step, {share} "
                        f"(90% interval {_interval_ms(top)} ms), "
                        f"{top['verdict']}. {top['evidence']}."),
                  ("p", "Change:" if top["apply_flags"] else "What to do:"), ("pre", _change(doc, top))]
    return blocks


def write_report(out: Path, doc: dict[str, Any]) -> None:
    res = doc if doc.get("result") else None
    job = (" ".join(doc["config"]["script"]) if doc["config"].get("script") else
           "trainscale train " + " ".join(doc["config"]["train_args"]))
    blocks: list[tuple] = _headline(doc) if res else []
    blocks.append(("p", f"Job: {job} ; 1 vs {doc['config']['nproc']} processes with "
                        f"{doc['config'].get('threads_per_process', '?')} intra-op thread(s) each, "
                        f"{doc.get('repeats', doc['config']['repeat'])} run(s) per experiment. "
                        f"Machine: {doc['machine']}."))
    if doc.get("external"):
        blocks.append(("p", _external_text(doc["external"])))
    if doc.get("injected"):  # a script instrumented from outside: which experiments ran, what its setup costs
        blocks += [("h2", "Your script as it is"), ("p", doc["injected"]["line"])]
        if doc["injected"].get("setup_causes"):
            blocks.append(("table", ["setting", "evidence", "change"],
                           [[c["name"], c["evidence"], c["advice"]] for c in doc["injected"]["setup_causes"]]))
    if res:
        blocks += [("p", f"Step time {res['step_time_1_s'] * 1e3:.3f} ms at 1 process, {res['step_time_n_s'] * 1e3:.3f}"
                         f" ms at {res['nproc']}: scaling loss {res['scaling_loss_s'] * 1e3:+.3f} ms/step "
                         f"(noise {res['scaling_loss_noise_s'] * 1e3:.3f} ms), efficiency {res['efficiency']:.1%}."
                         + _superlinear(res)),
                   ("h2", "Causes"),
                   ("table", ["#", "cause", "ms/step", "share of loss", "90% interval (ms)", "per repeat (ms)",
                              "verdict", "evidence"],
                    [[i if c["significant"] else "-", c["name"], f"{c['seconds_per_step'] * 1e3:+.3f}",
                      f"{c['share']:.0%}" if math.isfinite(c["share"]) else "-", _interval_ms(c),
                      ", ".join(f"{v * 1e3:+.2f}" for v in c["per_repeat_s"]), c["verdict"],
                      c["evidence"]] for i, c in enumerate(res["causes"], 1)]),
                   ("p", _sureness(res)),
                   ("h2", "Suggestions"),
                   ("table", ["cause", "suggestion"],
                    [[c["name"], c["suggestion"]] for c in res["causes"] if c["significant"]] or
                    [["-", "no cause above noise: nothing to change"]]),
                   ("img", PLOTS[2], "Each rank's step at N processes beside the 1-process step (medians of the "
                                     "base phase; error bar: range of the step time over repeats)"),
                   ("img", PLOTS[0], "Each cause in ms per step with its 90% interval; the dashed line is the total "
                                     "loss"),
                   ("img", PLOTS[1], "Median step time of each experiment at 1 and N processes (range over runs)")]
    if doc.get("apply") and not doc["apply"].get("decision"):  # a decision is told at the top
        blocks += [("h2", "Applied"), ("p", doc["apply"]["text"])]
    if doc.get("error"):
        blocks += [("h2", "Stopped by a failed run"), ("p", doc["error"]["message"]), ("pre", doc["error"]["command"])]
    blocks += [("h2", "How to read this"),
               ("p", "Each run is a plain command (listed below) whose blocks of steps cycle through the experiments "
                     "(--ablate.phases), so their differences are paired inside the run. Differences telescope: "
                     "input + communication + compute + framework = T_N - T_1. Every process count runs with the same "
                     "intra-op threads per process, so 1 and N compare like with like. A cause's interval is the "
                     "central 90% of its values over runs resampled by whole cycles of phases (a block bootstrap: "
                     "valid for skewed, autocorrelated step times; medians keep a 10x step from moving it). Verdict: "
                     "clear (the whole interval above the minimum worth reporting), likely (80% of resamples above "
                     "zero), undecided (large enough to matter, too noisy to tell: more repeats or a longer --budget "
                     "may decide it), no "
                     "(below the minimum share of the loss). How much its size varies between repeats is in the "
                     "per-repeat column. --apply adopts a change only when the 90% interval of its throughput gain "
                     "(repeats and cycles resampled) lies above zero."),
               ("h2", "Runs"),
               ("p", "Each run's folder (runs/<name>/) keeps its metrics.jsonl; runs/<name>.json is its summary "
                     "and runs/<name>.log its output."),
               ("pre", "\n".join(dict.fromkeys(r["command"] for r in doc["runs"])))]
    write_reports(out, "doctor", "trainscale doctor", blocks)




def print_result(doc: dict[str, Any]) -> None:
    """The console's account of a finished diagnosis: what bounds the step, the causes, the change to copy."""
    b_first = bool(doc.get("bottleneck", {}).get("name")) and bottleneck_first(doc)
    if b_first:
        console.print(_bottleneck_line(doc), highlight=False)
    console.print(_table(doc))
    for i, c in enumerate([c for c in doc["causes"] if c["significant"]], 1):
        console.print(f"{i}. [bold]{c['name']}[/bold]: {c['evidence']}\n   -> {c['suggestion']}", highlight=False)
        if i == 1 and c["apply_flags"]:
            console.print(f"   change: {_change(doc, c)}", markup=False, highlight=False)
    if not any(c["significant"] for c in doc["causes"]):
        console.print("no cause above the measured noise" + ("" if doc["scaling_loss_significant"] else
                      " (the scaling loss itself is within noise)"))
    if doc.get("bottleneck", {}).get("name") and not b_first:
        console.print(_bottleneck_line(doc), highlight=False)
    if doc.get("apply"):
        console.print(f"applied: {doc['apply']['text']}", highlight=False)
    for line in (doc.get("injected") or {}).get("lines", []):  # a script as it is: what ran, what its setup costs
        console.print(line, markup=False, highlight=False)
