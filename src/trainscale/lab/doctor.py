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
import time
from pathlib import Path
from typing import Any

from ..config import ConfigError, config_to_dict
from ..jobs import LauncherOptions, RunFailed, check_train_args, split_script
from ..nodes import add_node_options, follow, launcher_options, leading, nodes
from ..reporting import write_json
from ..reporting.console import console, err_console
from ..schema import PHASES
from .advice.script import cannot_apply, for_script, script_context
from .advice.setup import setup_causes
from .advice.suggest import context_from_config
from .analysis import CONFIGS, analyse
from .common import cores, machine_description
from .doctor_report import print_result, write_plots, write_report
from .experiments import Lab, injected_note
from .neighbours import LoadMonitor
from .plans import DoctorPlan, thread_candidates
from .progress import LabProgress
from .stats import job_step_time, median
from .verdict import adopt_verdict

__all__ = ["main"]

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainscale doctor", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Find out, by controlled experiments on your own job, why it does not scale. "
                    "Other options go to `trainscale train`.",
        epilog="examples:\n  trainscale doctor --nproc 2 --out runs/doctor\n"
               "  trainscale doctor --nproc 2 -- python my_train.py --my-args    # your own script on the run API\n"
               "  trainscale doctor --nproc 2 --strategy.bucket_mb 0 --model.depth 12 --apply\n"
               "  trainscale doctor --nproc 4 --nnodes 2 --node-rank R --master-addr node0   # on each node R")
    p.add_argument("--nproc", type=int, default=2, help="processes N compared with 1 (default 2)")
    p.add_argument("--repeat", type=int, default=3, help="runs at each size (default 3); a cause must show in every one")
    p.add_argument("--out", default="runs/doctor", help="folder for doctor.json, doctor.md/html and plots")
    p.add_argument("--apply", action="store_true", help="re-run with the top suggestion and measure the gain (a script not on the run API: "
                                           "names the change to make in it instead)")
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
    add_node_options(p)
    return p


def _apply(lab: Lab, res: dict[str, Any], runs: dict[tuple[str, int], list[dict[str, Any]]], n: int,
           repeat: int, phased: list[str]) -> dict[str, Any] | None:
    top = next((c for c in res["causes"] if c["significant"] and c["apply_flags"]), None)
    if top is None:
        return {"text": "no significant cause with a flag to change: nothing applied", "cause": None}
    lab.expect(2 * repeat)
    flags = [x for k, v in top["apply_flags"].items() for x in (f"--{k}", v)]
    # Measured as before (the base phase of phased runs), so before and after are alike.
    after = [lab.run("applied", n, [*phased, *flags], r, True)["base"] for r in range(repeat)]
    # The change applies at 1 process too (a bucket size, a batch): its 1-process reference is measured again,
    # so that efficiency after compares like with like.
    one_after = [lab.run("applied", 1, [*phased, *flags], r, False)["base"] for r in range(repeat)]
    w = lab.world(n, True)
    before = runs[("base", w)]
    sps1 = median(s["samples_per_s"] for s in runs[("base", 1)])
    sps1_after = median(s["samples_per_s"] for s in one_after)
    sps_b, sps_a = median(s["samples_per_s"] for s in before), median(s["samples_per_s"] for s in after)
    t0, t1 = median(job_step_time(s) for s in before), median(job_step_time(s) for s in after)
    eff_b, eff_a = sps_b / (w * sps1), sps_a / (w * sps1_after)
    v = adopt_verdict(before, after)
    return {"cause": top["name"], "flags": top["apply_flags"], "step_time_before_s": t0, "step_time_after_s": t1,
            "gain": v["gain"], "gain_interval": v["interval"], "decision": v["decision"],
            "samples_per_s_before": sps_b, "samples_per_s_after": sps_a,
            "efficiency_before": eff_b, "efficiency_after": eff_a,
            "text": f"{' '.join(flags)} (for {top['name']}): at {w} processes samples/s {sps_b:,.0f} -> {sps_a:,.0f}, "
                    f"step time {t0 * 1e3:.3f} -> {t1 * 1e3:.3f} ms, efficiency {eff_b:.0%} -> {eff_a:.0%}; "
                    f"{v['line']}"}


def main(argv: list[str]) -> int:
    """Entry of ``trainscale doctor``: check the options, run the plan, analyse, write and print the report."""
    given = argv[argv.index("--") + 1:] if "--" in argv else None
    argv, script = split_script(argv)
    args, rest = _parser().parse_known_args(argv)
    launcher = launcher_options(args)
    _check(args, nodes(launcher))
    cfg = check_train_args(rest)
    if cfg.strategy.fsdp and cfg.job.device != "cpu":
        _refuse_fsdp_on_a_gpu()
    if launcher.node_rank > 0:  # node 0 runs the experiments and writes the report; this node takes part
        return follow(launcher, args.timeout)
    if cfg.strategy.pipeline_stages > 1:
        return _pipeline_doctor(args, rest, script, cfg, launcher)
    n, world = args.nproc, args.nproc * nodes(launcher)  # N per node on every node, against 1 process
    plan = DoctorPlan(n, args.repeat, args.budget or (150.0 if args.quick else 600.0), args.quick)
    # Like for like: 1 and N processes get the same intra-op threads each (the N-process default), unless the
    # user chose; thread counts are compared only in their own experiment.
    threads = cfg.job.threads or max(1, cores() // n)
    if not cfg.job.threads:
        rest = [*rest, "--job.threads", str(threads)]
    out = Path(args.out)
    doc: dict[str, Any] = {"causes": [], "scaling_loss_s": None, "runs": [], "error": None, "apply": None,
                           "machine": machine_description(), "config": {
                               "nproc": world, "nnodes": nodes(launcher), "repeat": args.repeat,
                               "train_args": rest, "script": script, "command_as_given": given,
                               "threads_per_process": threads, "budget_s": plan.budget, "train": config_to_dict(cfg)}}
    # FSDP gathers parameters in forward: no step runs without communication, so its exposed wait is measured
    # per step instead (analysis.measured_exchange).
    phases = [p for p in PHASES if not (cfg.strategy.fsdp and p == "no_comm")]
    steps = cfg.log.skip_first + args.cycles * len(phases) * args.phase_steps
    phased = ["--ablate.phases", ",".join(phases), "--ablate.phase_steps", str(args.phase_steps), "--steps", str(steps)]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with LabProgress("doctor") as bar, LoadMonitor() as load, leading(launcher):
        out.mkdir(parents=True, exist_ok=True)  # once the lab's store is up: a refused port leaves no folder
        lab = Lab(out, rest, args.timeout, bar, bar.add_task("", total=2 * args.repeat), script, launcher)

        def analysed(**kw: Any) -> dict[str, Any]:
            return _analysed(runs, world, cfg, {"external": load.report()}, args, **kw)
        try:
            doc.update(_diagnose(lab, plan, runs, phased, analysed))
            doc["result"] = True
            if args.apply:  # a script trainscale did not write: it names the change instead of trying flags
                doc["apply"] = (cannot_apply(doc, script) if _script_context(runs, world) else
                                _apply(lab, doc, runs, n, doc["repeats"], phased))
        except RunFailed as e:
            doc["error"] = {"message": f"{e.spec.label} failed: {e.detail}", "command": e.spec.shell()}
        doc["runs"] = lab.log
    doc["external"] = load.report()
    doc["injected"] = _injected(doc, runs, lab.log, world)
    write_json(out / "doctor.json", doc)
    if doc.get("result"):
        write_plots(doc, lab.log, runs, out, world)
    write_report(out, doc)
    if doc.get("result"):
        print_result(doc)
    console.print(f"wrote {out / 'doctor.json'}, {out / 'doctor.md'}, {out / 'doctor.html'}")
    return _exit_code(doc)


def _analysed(runs: dict[tuple[str, int], list[dict[str, Any]]], world: int, cfg: Any, extra: dict[str, Any],
              args: argparse.Namespace, **kw: Any) -> dict[str, Any]:
    """The analysis of ``runs`` so far, its advice in the terms of the job it ran: the run API's options, or the
    script's own code when trainscale instrumented it from outside."""
    script_ctx = _script_context(runs, world)
    res = analyse(runs, world, {**(script_ctx or context_from_config(cfg)), **extra}, args.min_share,
                  args.min_step_share, **kw)
    if script_ctx:
        for_script(res, script_ctx)
    return res


def _script_context(runs: dict[tuple[str, int], list[dict[str, Any]]], world: int) -> dict[str, Any] | None:
    """The advice's context from the N-process runs of a script instrumented from outside; None on the run API."""
    base = runs.get(("base", world)) or []
    return script_context(base[0]) if base and base[0].get("injected") else None


def _injected(doc: dict[str, Any], runs: dict[tuple[str, int], list[dict[str, Any]]], log: list[dict[str, Any]],
              world: int) -> dict[str, Any] | None:
    """A script instrumented from outside: its framework, the experiments that ran, what its setup costs."""
    note = injected_note(runs, log)
    if note is None:
        return None
    base = runs.get(("base", world))
    note["setup_causes"] = setup_causes(base[0], doc.get("step_time_n_s") or job_step_time(base[0])) if base else []
    note["lines"] = [note["line"], *(f"setup: {c['name']}: {c['evidence']}\n   -> {c['advice']}"
                                     for c in note["setup_causes"])]
    return note


def _refuse_fsdp_on_a_gpu() -> None:
    """FSDP's exchange is measured as the training thread's wait in Gloo's collectives: a GPU's waits are the
    device's, which the host does not see."""
    import torch
    if torch.cuda.is_available():
        raise ConfigError("strategy.fsdp", True, "on a GPU the doctor cannot measure FSDP's exposed communication "
                          "(the host does not see the device's waits): add --job.device cpu, or measure its "
                          "scaling with trainscale bench --nproc 1,N --timeline")


def _check(args: argparse.Namespace, nnodes: int = 1) -> None:
    """The doctor's own options, before anything runs: one line for the first bad one."""
    if args.nproc < 1 or args.nproc * nnodes < 2:
        raise ConfigError("--nproc", args.nproc, "the doctor compares 1 with N processes: give N >= 2 (or N >= 1 "
                          "per node on several nodes)")
    if args.repeat < 2:
        raise ConfigError("--repeat", args.repeat, "must be >= 2: the noise is measured across repeats")
    if args.cycles < 1:
        raise ConfigError("--cycles", args.cycles, "must be >= 1")
    if args.phase_steps < 2:
        raise ConfigError("--phase-steps", args.phase_steps, "must be >= 2 (the first step of a block is not timed)")


def _diagnose(lab: Lab, plan: DoctorPlan, runs: dict[tuple[str, int], list[dict[str, Any]]], phased: list[str],
              analysed: Any) -> dict[str, Any]:
    """Run the plan's experiments and return the analysis of all of them (``RunFailed`` ends it)."""
    n, t_start = plan.n, time.monotonic()

    def one_repeat(r: int) -> None:
        # Alternating sizes, so that a drift of the machine hits both alike; the phases inside a run are paired.
        for k, everywhere in ((1, False), (n, True)):
            for name, part in lab.run("phases", k, phased, r, everywhere).items():
                runs.setdefault((name, lab.world(k, everywhere)), []).append(part)
    r = 0
    while not plan.first_repeats_done(r, time.monotonic() - t_start):
        one_repeat(r)
        r += 1
    res = analysed()
    while plan.repeat_again(res, r, time.monotonic() - t_start):  # sequential repeats while a cause is open
        lab.expect(2)
        one_repeat(r)
        r += 1
        res = analysed()
    if plan.go_deeper(res):
        res = analysed(**_second_level(lab, runs, n, r))
    res.update(budget_s=plan.budget, budget_used_s=time.monotonic() - t_start, repeats=r)
    return res


def _second_level(lab: Lab, runs: dict[tuple[str, int], list[dict[str, Any]]], n: int, repeats: int
                  ) -> dict[str, Any]:
    """The sleep test, operator profiles at 1 and N, thread trials: which part of compute is slower at N."""
    w = lab.world(n, True)
    cands = thread_candidates(runs[("base", w)][0].get("threads") or 1, n, cores())
    # The sleep test takes the exchange out (not under FSDP) and replaces the model's operators (not on a script
    # instrumented from outside, whose model trainscale did not build).
    sleep_test = not runs[("base", w)][0].get("fsdp") and not runs[("base", w)][0].get("injected")
    lab.expect(2 * repeats * sleep_test + 2 + len(cands) * repeats)
    for r in range(repeats * sleep_test):
        # The sleep test: the N-process run sleeps the durations calibrated at 1 process, so an operator that is
        # slow only at N stays compute, and what remains is the framework's own cost.
        one = lab.run("sleep", 1, CONFIGS["sleep"], r)
        runs.setdefault(("sleep", 1), []).append(one)
        runs.setdefault(("sleep", w), []).append(
            lab.run("sleep", n, [*CONFIGS["sleep"], "--ablate.sleep_times", one["sleep_times"]], r, True))
    prof = [json.loads(Path(lab.run("profile", k, ["--profile"], 0, everywhere)["profile_json"]).read_text())
            for k, everywhere in ((1, False), (n, True))]
    threads = {t: [lab.run(f"threads{t}", n, ["--job.threads", str(t)], r, True) for r in range(repeats)]
               for t in cands}
    return {"profiles": (prof[0], prof[1]), "threads": threads}


def _pipeline_doctor(args: argparse.Namespace, rest: list[str], script: list[str] | None, cfg: Any,
                     launcher: LauncherOptions) -> int:
    """A pipelined job against itself with more micro-batches and with the measured split, runs alternating."""
    from .pipeline_analysis import pipeline_causes, pipeline_experiments

    out = Path(args.out)
    experiments = pipeline_experiments(cfg)
    runs: dict[str, list[dict[str, Any]]] = {}
    doc: dict[str, Any] = {"kind": "pipeline", "causes": [], "runs": [], "error": None,
                           "machine": machine_description(),
                           "config": {"nproc": args.nproc, "repeat": args.repeat, "train_args": rest}}
    with LabProgress("doctor") as bar, leading(launcher):
        out.mkdir(parents=True, exist_ok=True)
        lab = Lab(out, rest, args.timeout, bar, bar.add_task("", total=args.repeat * len(experiments)), script,
                  launcher)
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
