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
from .decomposition import WHAT_IF, decompose, share_text
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
    for i, c in enumerate(_parts(res), 1):
        v = c["seconds_per_step"]
        t.add_row(str(i) if c["significant"] else "-", c["name"] + (f" (rank {c['rank']})" if c["name"] ==
                  "straggler" and c["verdict"] != "no" else ""),
                  f"{v * 1e3:+.3f}" if math.isfinite(v) else "-", share_text(c, res), _interval_ms(c), c["verdict"])
    return t


def _parts(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The causes that are parts of the measured loss (the what-if experiments are reported apart)."""
    return [c for c in res["causes"] if c["name"] not in WHAT_IF]


def _top(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The first clear part of the loss: the one change the report leads with."""
    return next((c for c in _parts(doc) if c["significant"]), None)


def _interval_ms(c: dict[str, Any]) -> str:
    lo, hi = c.get("interval_s") or (float("nan"), float("nan"))
    return f"{lo * 1e3:+.2f} .. {hi * 1e3:+.2f}" if math.isfinite(lo) and math.isfinite(hi) else "-"


def write_plots(res: dict[str, Any], lab_log: list[dict[str, Any]], runs: dict[tuple[str, int], list[dict[str, Any]]],
           out: Path, n: int) -> None:
    causes = [c for c in _parts(res) if math.isfinite(c["seconds_per_step"])]
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
    top = _top(doc)
    loss_share = doc["scaling_loss_s"] / doc["step_time_n_s"] if doc.get("step_time_n_s") else 0.0
    return top is None or b["share"] > loss_share


def _bottleneck_line(doc: dict[str, Any]) -> str:
    b = doc["bottleneck"]
    return (f"What bounds the step at {b['nproc']} processes: {b['name'].replace('_', ' ')}, {b['share']:.0%} of it "
            f"({b['evidence']}). {b['advice'][:1].upper()}{b['advice'][1:]}.")


def _headline(doc: dict[str, Any]) -> list[tuple]:
    """The report's first screen, in the order a user asks: what bounds the step at N, what the scaling loss is
    made of, then the one change to make and what it is measured to give."""
    blocks: list[tuple] = [("p", _bottleneck_line(doc))] if doc.get("bottleneck", {}).get("name") else []
    blocks += [("p", _composition_line(doc)), *_scaling_headline(doc)]
    if doc.get("apply") and doc["apply"].get("decision"):
        blocks.append(("p", f"Applied: {doc['apply']['text']}"))
    return blocks


def _composition_line(doc: dict[str, Any]) -> str:
    """The scaling loss as parts that add up to it: the causes that matter, the others together, and the rest
    (noise and what no experiment isolates), each part in ms with its share or what it is instead."""
    d = doc.get("decomposition") or decompose(doc)
    loss, noise = d["loss_s"], d["noise_s"]
    by = {c["name"]: c for c in doc["causes"]}
    shown = [p for p in d["parts"] if by[p["name"]]["verdict"] in ("clear", "likely")
             or abs(p["s"]) > max(noise, 0.1 * abs(loss))]
    others = [p for p in d["parts"] if p not in shown]
    items = [f"{p['name'].replace('_', ' ')} {p['s'] * 1e3:+.3f} ms ({share_text(by[p['name']], doc)})" for p in shown]
    if others:
        items.append(f"{len(others)} other cause(s) {sum(p['s'] for p in others) * 1e3:+.3f} ms")
    items.append(f"noise and unexplained {d['rest_s'] * 1e3:+.3f} ms")
    within = "" if doc.get("scaling_loss_significant") else ", within its noise"
    return (f"The scaling loss, {loss * 1e3:+.3f} ms/step from 1 to {doc['nproc']} processes (noise "
            f"{noise * 1e3:.3f} ms{within}), is made of: " + "; ".join(items) + ".")


def _share_phrase(top: dict[str, Any], doc: dict[str, Any]) -> str:
    """What part of the loss the top cause is, in words: a share, or what it is when it is not one."""
    text = share_text(top, doc)
    loss = f"{doc['scaling_loss_s'] * 1e3:+.3f} ms"
    if text.endswith("%"):
        return f"{text} of the scaling loss"
    if text == "-":  # no loss (a job that scales superlinearly) leaves nothing to take a share of: never "nan%"
        return f"with no scaling loss to share (efficiency {doc['efficiency']:.0%})"
    if text.startswith("all"):
        return f"all of the scaling loss ({loss}; the estimate is above it within the noise of both)"
    return f"more than the whole scaling loss ({loss}: other parts made the step faster)"


def _scaling_headline(doc: dict[str, Any]) -> list[tuple]:
    """The scaling verdict: the top cause with its share and interval and the change to copy, or that none is clear."""
    top = _top(doc)
    if top is None:
        likely = [c["name"] for c in _parts(doc) if c["verdict"] in ("likely", "undecided")]
        return [("p", f"Verdict: no cause is clear above the measured noise (scaling loss "
                      f"{doc['scaling_loss_s'] * 1e3:+.3f} ms/step, efficiency {doc['efficiency']:.0%})."
                      + (f" Not decided yet: {', '.join(likely)}; raise --repeat or --budget." if likely else
                         " Nothing to change for scaling."))]
    name = top["name"] + (f" (rank {top['rank']})" if top["name"] == "straggler" else "")
    blocks = [("p", f"Verdict: {name} costs {top['seconds_per_step'] * 1e3:+.3f} ms/step, {_share_phrase(top, doc)} "
                    f"(90% interval {_interval_ms(top)} ms), "
                    f"{top['verdict']}. {top['evidence']}."),
              ("p", "Change:" if top["apply_flags"] else "What to do:"), ("pre", _change(doc, top))]
    if top["apply_flags"] and not (doc.get("apply") or {}).get("decision"):
        blocks.append(("p", f"What it gives: up to {top['seconds_per_step'] * 1e3:.3f} ms/step at {doc.get('nproc')} "
                            "processes, the size of the part it removes; --apply runs the change and measures it."))
    elif doc.get("injected"):  # a change to the user's own code or machine: trainscale cannot make it, only size it
        loss = doc["scaling_loss_s"]
        gain = min(top["seconds_per_step"], loss) if math.isfinite(loss) and loss > 0 else top["seconds_per_step"]
        blocks.append(("p", f"What it gives: up to {gain * 1e3:.3f} ms/step at {doc.get('nproc')} processes, the size "
                            "of the part it removes (never more than the whole scaling loss); trainscale cannot make "
                            "this change for you: make it, then run the doctor again to measure it."))
    return blocks


def _what_if_rows(doc: dict[str, Any]) -> list[list[Any]]:
    """The experiments that tried another configuration (not parts of the loss), each with its measured gain."""
    rows = [[w["name"], w["suggestion"], f"{w['gain_s'] * 1e3:+.3f} ms/step "
             f"({w['gain']:+.1%} of the step at {doc['nproc']})" if math.isfinite(w["gain"]) else "-",
             w["verdict"], w["evidence"]] for w in doc.get("what_if") or []]
    a = doc.get("apply") or {}
    if a.get("cause"):
        rows.append(["--apply", " ".join(f"--{k} {v}" for k, v in a["flags"].items()),
                     f"{a['gain']:+.1%} samples/s", a["decision"], a["text"]])
    return rows


def _cause_row(i: int, c: dict[str, Any], res: dict[str, Any]) -> list[Any]:
    """One row of the causes table. The share column holds shares only (0-100%); a part above the loss or below
    zero shows "-" there and says what it is at the head of its evidence."""
    share = share_text(c, res)
    odd = not share.endswith("%") and share != "-"
    return [i if c["significant"] else "-", c["name"], f"{c['seconds_per_step'] * 1e3:+.3f}",
            share if not odd else "-", _interval_ms(c), ", ".join(f"{v * 1e3:+.2f}" for v in c["per_repeat_s"]),
            c["verdict"], (f"({share}) " if odd else "") + c["evidence"]]


def _result_blocks(res: dict[str, Any]) -> list[tuple]:
    """The analysis in full: step times, every part of the loss, the what-if experiments, the plots."""
    blocks: list[tuple] = [
        ("p", f"Step time {res['step_time_1_s'] * 1e3:.3f} ms at 1 process, {res['step_time_n_s'] * 1e3:.3f}"
              f" ms at {res['nproc']}: scaling loss {res['scaling_loss_s'] * 1e3:+.3f} ms/step "
              f"(noise {res['scaling_loss_noise_s'] * 1e3:.3f} ms), efficiency {res['efficiency']:.1%}."
              + _superlinear(res)),
        ("h2", "Causes"),
        ("table", ["#", "cause", "ms/step", "share of loss", "90% interval (ms)", "per repeat (ms)", "verdict",
                   "evidence"],
         [_cause_row(i, c, res) for i, c in enumerate(_parts(res), 1)]),
        ("p", _sureness(res))]
    if rows := _what_if_rows(res):
        blocks += [("h2", "What-if experiments"),
                   ("p", "Other configurations tried, not parts of the measured loss: each gain is measured."),
                   ("table", ["experiment", "change", "measured gain", "verdict", "evidence"], rows)]
    return blocks + [
        ("h2", "Suggestions"),
        ("table", ["cause", "suggestion"], [[c["name"], c["suggestion"]] for c in _parts(res) if c["significant"]]
         or [["-", "no cause above noise: nothing to change"]]),
        ("img", PLOTS[2], "Each rank's step at N processes beside the 1-process step (medians of the base phase; "
                          "error bar: range of the step time over repeats)"),
        ("img", PLOTS[0], "Each cause in ms per step with its 90% interval; the dashed line is the total loss"),
        ("img", PLOTS[1], "Median step time of each experiment at 1 and N processes (range over runs)")]


def write_report(out: Path, doc: dict[str, Any]) -> None:
    res = doc if doc.get("result") else None
    given = doc["config"].get("command_as_given")
    job = (shlex.join(given) if doc.get("injected") and given else  # the user's own command, launcher and all
           " ".join(doc["config"]["script"]) if doc["config"].get("script") else
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
        blocks += _result_blocks(res)
    if doc.get("apply") and not doc["apply"].get("decision"):  # a decision is told at the top
        blocks += [("h2", "Not applied" if doc["apply"].get("not_applied") else "Applied"), ("p", doc["apply"]["text"])]
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
                     "per-repeat column. " + _apply_rule(doc)),
               ("h2", "Runs"),
               ("p", "Each run's folder (runs/<name>/) keeps its metrics.jsonl; runs/<name>.json is its summary "
                     "and runs/<name>.log its output."),
               ("pre", "\n".join(dict.fromkeys(r["command"] for r in doc["runs"])))]
    write_reports(out, "doctor", "trainscale doctor", blocks)


def _apply_rule(doc: dict[str, Any]) -> str:
    """How --apply decides, or, on a script instrumented from outside, that its changes are the user's to make."""
    if doc.get("injected"):
        return ("Every change advised here is to your script's own code: trainscale cannot make it (--apply does "
                "not run), and a part's size is what removing that part saved, the most its fix can give.")
    return ("--apply adopts a change only when the 90% interval of its throughput gain (repeats and cycles "
            "resampled) lies above zero.")


def print_result(doc: dict[str, Any]) -> None:
    """The console's account of a finished diagnosis: what bounds the step, what the loss is made of, the causes,
    the change to copy, then the what-if experiments."""
    if doc.get("bottleneck", {}).get("name"):
        console.print(_bottleneck_line(doc), highlight=False)
    console.print(_composition_line(doc), highlight=False)
    console.print(_table(doc))
    for i, c in enumerate([c for c in _parts(doc) if c["significant"]], 1):
        console.print(f"{i}. [bold]{c['name']}[/bold]: {c['evidence']}\n   -> {c['suggestion']}", highlight=False)
        if i == 1 and c["apply_flags"]:
            console.print(f"   change: {_change(doc, c)}", markup=False, highlight=False)
    if not any(c["significant"] for c in _parts(doc)):
        console.print("no cause above the measured noise" + ("" if doc["scaling_loss_significant"] else
                      " (the scaling loss itself is within noise)"))
    for row in _what_if_rows(doc):
        console.print(f"what-if {row[0]} ({row[1]}): {row[2]}, {row[3]}", markup=False, highlight=False)
    if doc.get("apply"):
        lead = "" if doc["apply"].get("not_applied") else "applied: "
        console.print(f"{lead}{doc['apply']['text']}", markup=False, highlight=False)
    for line in (doc.get("injected") or {}).get("lines", []):  # a script as it is: what ran, what its setup costs
        console.print(line, markup=False, highlight=False)
