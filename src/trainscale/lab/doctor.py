"""``trainscale doctor``: controlled experiments that name why a job does not scale, with shares and evidence.

It runs your job (``trainscale train`` with your options) at 1 and N processes. Each run cycles through
blocks of steps that remove one more part of the step (``--ablate.phases base,no_data,no_comm``), so the
phases are paired measurements under the run's own conditions. It splits the scaling loss T_N - T_1 (same
per-device batch) into causes: communication, sync_wait (waiting for each step's slowest rank), input,
compute_interference, framework_overhead (the sleep test: operators replaced by sleeps of their time), slow_operator (per-operator profiles at 1 and N),
straggler (per-rank compute times), threads and external_load.
A cause is significant only when every repeat shows it above its measured noise. ``--apply`` re-runs with the
top suggestion and measures the gain.

Example::

    trainscale doctor --nproc 2 --model resnet18 --model.width 8 --data synthetic --steps 40 --out runs/doctor
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import time
from pathlib import Path
from typing import Any

from rich.console import JustifyMethod
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..config import PHASES, ConfigError, config_to_dict
from ..jobs import RunFailed, RunSpec, check_train_args, run_train, split_script
from ..reporting import figure, save, write_json, write_reports
from ..reporting.console import console, err_console
from .analysis import CONFIGS, analyse
from .common import cores, machine_description
from .neighbours import LoadMonitor
from .ranks import plot_ranks
from .stats import job_step_time, median
from .suggest import context_from_config
from .verdict import adopt_verdict

__all__ = ["main"]

PLOTS = ("causes.png", "experiments.png", "ranks.png")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainscale doctor", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Find out, by controlled experiments on your own job, why it does not scale. "
                    "Other options go to `trainscale train`.",
        epilog="examples:\n  trainscale doctor --nproc 2 --out runs/doctor\n"
               "  trainscale doctor --nproc 2 -- python my_train.py --my-args    # your own script on the run API\n"
               "  trainscale doctor --nproc 2 --strategy.bucket_mb 0 --model.depth 12 --apply")
    p.add_argument("--nproc", type=int, default=2, help="processes N compared with 1 (default 2)")
    p.add_argument("--repeat", type=int, default=3, help="runs at each size (default 3); a cause must show in every one")
    p.add_argument("--out", default="runs/doctor", help="folder for doctor.json, doctor.md/html and plots")
    p.add_argument("--apply", action="store_true", help="re-run with the top suggestion and measure the gain")
    p.add_argument("--quick", action="store_true",
                   help="first-level experiments only (input, communication, compute, stragglers): no sleep test, "
                        "profiles or thread trials")
    p.add_argument("--min-share", type=float, default=0.15,
                   help="smallest share of the loss a cause must explain to be clear (default 0.15: on a shared "
                        "machine, smaller shares are within what placement changes between runs)")
    p.add_argument("--min-step-share", type=float, default=0.05,
                   help="smallest cost, as a share of the N-process step, that a cause must have to be clear "
                        "(default 0.05: a job that loses less than that to a cause is not held back by it)")
    p.add_argument("--cycles", type=int, default=6,
                   help="times each run cycles through its phases (default 6; the bootstrap resamples these cycles); the doctor sets job.steps from this")
    p.add_argument("--phase-steps", type=int, default=8, help="steps per phase block (default 8)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take before it is ended")
    p.add_argument("--budget", type=float, default=0.0,
                   help="seconds the doctor may spend; it repeats the runs (up to 2 x --repeat) while a cause is "
                        "only likely or undecided and time is left (default: 150 with --quick, 600 without; never fewer than 2 "
                        "repeats)")
    return p


def phase_parts(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A phased run's summary as one summary per phase (the run's fields with that phase's timings)."""
    return {ph: {**summary, **v} for ph, v in summary["phases"].items()}


class _Lab:
    """Runs experiments, keeps every summary, and stops cleanly on the first failure."""

    def __init__(self, out: Path, user: list[str], timeout: float, bar: Progress, task: Any,
                 script: list[str] | None = None):
        self.out, self.user, self.timeout, self.bar, self.task, self.script = out, user, timeout, bar, task, script
        self.log: list[dict[str, Any]] = []

    def run(self, name: str, k: int, extra: list[str], r: int) -> dict[str, Any]:
        """One run; a run with phases is logged and returned as one summary per phase."""
        self.bar.update(self.task, description=f"{name} at {k} process(es), run {r + 1}")
        spec = RunSpec(k, [*self.user, *extra], self.out / "runs" / f"{name}_n{k}_r{r}.json",
                       f"experiment {name} at {k} process(es)", script=self.script)
        s = run_train(spec, self.timeout)
        parts = phase_parts(s) if s.get("phases") else {name: s}
        for ph, p in parts.items():
            self.log.append({"experiment": ph if name == "phases" else f"{name} ({ph})", "nproc": k, "repeat": r,
                             "step_time_s": p["step_time_s"], "job_step_time_s": job_step_time(p),
                             "samples_per_s": p["samples_per_s"], "rank_compute_s": p.get("rank_compute_s"),
                             "rank_step_time_s": p.get("rank_step_time_s"), "data_wait_frac": p.get("data_wait_frac"),
                             "threads": p.get("threads"), "command": s["command"]})
        self.bar.advance(self.task)
        return parts if s.get("phases") else s


def _thread_candidates(current: int, n: int) -> list[int]:
    c = cores()
    return sorted({t for t in (1, max(1, c // n), c) if t != current})[:2]


def _grow(bar: Progress, task: TaskID, runs: int) -> None:
    """Add ``runs`` more runs to the bar's total (set when the task was added)."""
    total = bar.tasks[0].total
    assert total is not None
    bar.update(task, total=total + runs)


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


def _plots(res: dict[str, Any], lab_log: list[dict[str, Any]], runs: dict[tuple[str, int], list[dict[str, Any]]],
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
    top = ", ".join(f"{p['name']} (pid {p['pid']}) {p['cores']:.2f}" for p in ext.get("top", [])[:4]) or "none"
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
        blocks = [("p", f"Verdict: {name} costs {top['seconds_per_step'] * 1e3:+.3f} ms/step, "
                        f"{top['share']:.0%} of the scaling loss (90% interval {_interval_ms(top)} ms), "
                        f"{top['verdict']}. {top['evidence']}."),
                  ("p", "Change:" if top["apply_flags"] else "What to do:"), ("pre", _change(doc, top))]
    return blocks


def _report(out: Path, doc: dict[str, Any]) -> None:
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
                     "clear (the interval excludes zero), likely (80% of resamples above zero), undecided (large "
                     "enough to matter, too noisy to tell: more repeats or a longer --budget may decide it), no "
                     "(below the minimum share of the loss). How much its size varies between repeats is in the "
                     "per-repeat column. --apply adopts a change only when the 90% interval of its throughput gain "
                     "(repeats and cycles resampled) lies above zero."),
               ("h2", "Runs"),
               ("p", "Each run's folder (runs/<name>/) keeps its metrics.jsonl; runs/<name>.json is its summary "
                     "and runs/<name>.log its output."),
               ("pre", "\n".join(dict.fromkeys(r["command"] for r in doc["runs"])))]
    write_reports(out, "doctor", "trainscale doctor", blocks)


def _apply(lab: _Lab, res: dict[str, Any], runs: dict[tuple[str, int], list[dict[str, Any]]], n: int,
           repeat: int, phased: list[str]) -> dict[str, Any] | None:
    top = next((c for c in res["causes"] if c["significant"] and c["apply_flags"]), None)
    if top is None:
        return {"text": "no significant cause with a flag to change: nothing applied", "cause": None}
    flags = [x for k, v in top["apply_flags"].items() for x in (f"--{k}", v)]
    # Measured as before (the base phase of phased runs), so before and after are alike.
    after = [lab.run("applied", n, [*phased, *flags], r)["base"] for r in range(repeat)]
    # The change applies at 1 process too (a bucket size, a batch): its 1-process reference is measured again,
    # so that efficiency after compares like with like.
    one_after = [lab.run("applied", 1, [*phased, *flags], r)["base"] for r in range(repeat)]
    before = runs[("base", n)]
    sps1 = median(s["samples_per_s"] for s in runs[("base", 1)])
    sps1_after = median(s["samples_per_s"] for s in one_after)
    sps_b, sps_a = median(s["samples_per_s"] for s in before), median(s["samples_per_s"] for s in after)
    t0, t1 = median(job_step_time(s) for s in before), median(job_step_time(s) for s in after)
    eff_b, eff_a = sps_b / (n * sps1), sps_a / (n * sps1_after)
    v = adopt_verdict(before, after)
    return {"cause": top["name"], "flags": top["apply_flags"], "step_time_before_s": t0, "step_time_after_s": t1,
            "gain": v["gain"], "gain_interval": v["interval"], "decision": v["decision"],
            "samples_per_s_before": sps_b, "samples_per_s_after": sps_a,
            "efficiency_before": eff_b, "efficiency_after": eff_a,
            "text": f"{' '.join(flags)} (for {top['name']}): at {n} processes samples/s {sps_b:,.0f} -> {sps_a:,.0f}, "
                    f"step time {t0 * 1e3:.3f} -> {t1 * 1e3:.3f} ms, efficiency {eff_b:.0%} -> {eff_a:.0%}; "
                    f"{v['line']}"}


def main(argv: list[str]) -> int:
    """Entry of ``trainscale doctor``."""
    argv, script = split_script(argv)
    args, rest = _parser().parse_known_args(argv)
    if args.nproc < 2:
        raise ConfigError("--nproc", args.nproc, "the doctor compares 1 with N processes: give N >= 2")
    if args.repeat < 2:
        raise ConfigError("--repeat", args.repeat, "must be >= 2: the noise is measured across repeats")
    if args.cycles < 1:
        raise ConfigError("--cycles", args.cycles, "must be >= 1")
    if args.phase_steps < 2:
        raise ConfigError("--phase-steps", args.phase_steps, "must be >= 2 (the first step of a block is not timed)")
    cfg = check_train_args(rest)
    n, R = args.nproc, args.repeat
    if cfg.strategy.pipeline_stages > 1:
        return _pipeline_doctor(args, rest, script, cfg)
    budget = args.budget or (150.0 if args.quick else 600.0)
    # Like for like: 1 and N processes get the same intra-op threads each (the N-process default), unless the
    # user chose; thread counts are compared only in their own experiment.
    threads = cfg.job.threads or max(1, cores() // n)
    if not cfg.job.threads:
        rest = [*rest, "--job.threads", str(threads)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = context_from_config(cfg)
    doc: dict[str, Any] = {"causes": [], "scaling_loss_s": None, "runs": [], "error": None, "apply": None,
                           "machine": machine_description(), "config": {
                               "nproc": n, "repeat": R, "train_args": rest, "script": script,
                               "threads_per_process": threads, "budget_s": budget, "train": config_to_dict(cfg)}}
    first = PHASES
    steps = cfg.log.skip_first + args.cycles * len(first) * args.phase_steps
    phased = ["--ablate.phases", ",".join(first), "--ablate.phase_steps", str(args.phase_steps),
              "--steps", str(steps)]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    profiles = thread_runs = None
    t_start = time.monotonic()
    with Progress(TextColumn("doctor {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar, LoadMonitor() as load:
        task = bar.add_task("", total=2 * R)
        lab = _Lab(out, rest, args.timeout, bar, task, script)

        def one_repeat(r: int) -> None:
            # Alternating sizes, so that a drift of the machine hits both alike; the phases inside a run are paired.
            for k in (1, n):
                for name, part in lab.run("phases", k, phased, r).items():
                    runs.setdefault((name, k), []).append(part)

        def analysed(**kw: Any) -> dict[str, Any]:
            return analyse(runs, n, {**ctx, "external": load.report()}, args.min_share, args.min_step_share, **kw)

        try:
            r = 0
            while r < max(2, R) and (r < 2 or time.monotonic() - t_start < budget):
                one_repeat(r)
                r += 1
            res = analysed()
            # Sequential repeats: measure on while a cause stays undecided and the budget allows.
            while (any(c["verdict"] in ("undecided", "likely") for c in res["causes"]) and r < 2 * max(2, R)
                   and time.monotonic() - t_start + (time.monotonic() - t_start) / r < budget):
                _grow(bar, task, 2)
                one_repeat(r)
                r += 1
                res = analysed()
            R = r
            # Compute slower at N (interference, a straggler, or the neighbour's share of it): the second-level
            # experiments (sleep test, operator profiles, thread counts) say which part of compute.
            compute_kinds = ("compute_interference", "straggler", "external_load")
            if not args.quick and any(c["significant"] for c in res["causes"] if c["name"] in compute_kinds):
                current = runs[("base", n)][0].get("threads") or 1
                cands = _thread_candidates(current, n)
                _grow(bar, task, 2 * R + 2 + len(cands) * R)
                for r in range(R):
                    # Seed 000's sleep test: the N-process run sleeps the durations calibrated at 1 process, so an
                    # operator that is slow only at N stays compute, and what remains is the framework's own cost.
                    one = lab.run("sleep", 1, CONFIGS["sleep"], r)
                    runs.setdefault(("sleep", 1), []).append(one)
                    runs.setdefault(("sleep", n), []).append(
                        lab.run("sleep", n, [*CONFIGS["sleep"], "--ablate.sleep_times", one["sleep_times"]], r))
                prof = []
                for k in (1, n):
                    s = lab.run("profile", k, ["--profile"], 0)
                    prof.append(json.loads(Path(s["profile_json"]).read_text()))
                profiles = (prof[0], prof[1])
                thread_runs = {t: [lab.run(f"threads{t}", n, ["--job.threads", str(t)], r) for r in range(R)]
                               for t in cands}
                res = analysed(profiles=profiles, threads=thread_runs)
            res.update(budget_s=budget, budget_used_s=time.monotonic() - t_start, repeats=R)
            doc.update(res)
            doc["result"] = True
            if args.apply:
                _grow(bar, task, 2 * R)
                doc["apply"] = _apply(lab, res, runs, n, R, phased)
        except RunFailed as e:
            doc["error"] = {"message": f"{e.spec.label} failed: {e.detail}", "command": e.spec.shell()}
        doc["runs"] = lab.log
    doc["external"] = load.report()
    write_json(out / "doctor.json", doc)
    if doc.get("result"):
        _plots(doc, lab.log, runs, out, n)
    _report(out, doc)
    if doc.get("result"):
        res = doc
        if doc.get("bottleneck", {}).get("name") and bottleneck_first(doc):
            console.print(_bottleneck_line(doc), highlight=False)
        console.print(_table(res))
        for i, c in enumerate([c for c in res["causes"] if c["significant"]], 1):
            console.print(f"{i}. [bold]{c['name']}[/bold]: {c['evidence']}\n   -> {c['suggestion']}", highlight=False)
            if i == 1 and c["apply_flags"]:
                console.print(f"   change: {_change(doc, c)}", markup=False, highlight=False)
        if not any(c["significant"] for c in res["causes"]):
            console.print("no cause above the measured noise" + ("" if res["scaling_loss_significant"] else
                          " (the scaling loss itself is within noise)"))
        if doc.get("bottleneck", {}).get("name") and not bottleneck_first(doc):
            console.print(_bottleneck_line(doc), highlight=False)
        if doc.get("apply"):
            console.print(f"applied: {doc['apply']['text']}", highlight=False)
    console.print(f"wrote {out / 'doctor.json'}, {out / 'doctor.md'}, {out / 'doctor.html'}")
    return _exit_code(doc)


def _pipeline_doctor(args: argparse.Namespace, rest: list[str], script: list[str] | None, cfg: Any) -> int:
    """A pipelined job against itself with more micro-batches and with the measured split, runs alternating."""
    from .pipeline_analysis import pipeline_causes, pipeline_experiments

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    experiments = pipeline_experiments(cfg)
    runs: dict[str, list[dict[str, Any]]] = {}
    doc: dict[str, Any] = {"kind": "pipeline", "causes": [], "runs": [], "error": None,
                           "machine": machine_description(),
                           "config": {"nproc": args.nproc, "repeat": args.repeat, "train_args": rest}}
    with Progress(TextColumn("doctor {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        lab = _Lab(out, rest, args.timeout, bar, bar.add_task("", total=args.repeat * len(experiments)), script)
        try:
            for r in range(args.repeat):  # alternating, so that a drift of the machine hits every variant alike
                for name, extra in experiments.items():
                    runs.setdefault(name, []).append(lab.run(name, args.nproc, extra, r))
            doc["causes"] = pipeline_causes(runs, cfg)
        except RunFailed as e:
            doc["error"] = {"message": f"{e.spec.label} failed: {e.detail}", "command": e.spec.shell()}
        doc["runs"] = lab.log
    write_json(out / "doctor.json", doc)
    for i, c in enumerate(doc["causes"], 1):
        console.print(f"{i}. [bold]{c['name']}[/bold] ({c['verdict']}, {c['seconds_per_step'] * 1e3:.1f} ms/step, "
                      f"{c['share']:.0%} of the step): {c['evidence']}\n   -> {c['suggestion']}", highlight=False)
    console.print(f"wrote {out / 'doctor.json'}")
    return _exit_code(doc)


def _exit_code(doc: dict[str, Any]) -> int:
    """1, with the failed run's message and command, when an experiment failed; else 0."""
    if doc["error"]:
        err_console.print(f"trainscale doctor: {doc['error']['message']}\n  command: {doc['error']['command']}",
                          markup=False, highlight=False)
        return 1
    return 0
