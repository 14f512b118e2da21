"""``trainscale ps experiment runtime|convergence``: the parameter-server modes' runtime and convergence claims (Dutta et al. 2018), measured on this machine.

* runtime: mean time per update of each mode under exponential delays, against the order-statistics
  predictions of :mod:`trainscale.costs.order_stats`, for several P; the sync/async ratio against P * H_P; and the bytes per
  update through the server against a ring all-reduce of the same gradients.
* convergence: eval error on digits against wall-clock and against updates for sync, k-sync, async and
  k-async, the asynchronous ones with and without the staleness rule.

Every cell runs with several seeds (``--seeds``, ``--job.seed`` of each run); the reports give each cell's mean
± standard error and 95% interval. Each writes ``<out>/<name>.md``, ``.html``, ``.json`` (every seed's run and
the cells) and PNG plots; one Ray instance and one set of actors serve all the runs of an experiment.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import ConfigError, load_config
from ..config_io import int_list
from ..costs.order_stats import predicted_update_time
from ..log import logger, setup_logging

__all__ = ["main", "runtime_experiment", "convergence_experiment"]

RUNTIME_MODES = ("sync", "k-sync", "async", "k-async", "k-batch-sync", "k-batch-async")
CONVERGENCE_RUNS = (("sync", "constant"), ("k-sync", "constant"), ("async", "constant"), ("async", "staleness"),
                    ("k-async", "constant"), ("k-async", "staleness"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainscale ps experiment",
                                description="Measure the parameter-server modes' runtime and convergence claims and write a report.")
    p.add_argument("kind", choices=("runtime", "convergence"))
    p.add_argument("--out", default="", help="report folder (default: ps-<kind>)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per cell, run as --job.seed 0..N-1 (default 3)")
    p.add_argument("--learners", default="", help="comma-separated P values (runtime: 2,4,8; convergence: 4)")
    p.add_argument("--modes", default="", help="comma-separated modes (runtime only)")
    p.add_argument("--mean", type=float, default=0.0, help="mean of the exponential delay, seconds "
                                                         "(runtime: 0.2; convergence: 0.02)")
    p.add_argument("--seconds", type=float, default=0.0, help="runtime: target seconds per run; "
                                                            "convergence: wall-clock of each run (default 6 / 12)")
    p.add_argument("--min-updates", type=int, default=25, help="runtime: fewest updates per run")
    p.add_argument("--max-updates", type=int, default=400, help="runtime: most updates per run")
    p.add_argument("--ray-address", default=None, help="join a running Ray cluster")
    return p


def main(argv: list[str]) -> int:
    """Entry of ``trainscale ps experiment``; extra ``--section.field value`` set the runs' configuration."""
    args, rest = _parser().parse_known_args(argv)
    base = load_config(rest)  # validates the overrides before Ray starts
    setup_logging(base.log.level, rank=0)
    out = Path(args.out or f"ps-{args.kind}")
    ps_values = int_list(args.learners, "--learners", "comma-separated integers, e.g. 2,4,8") if args.learners else None
    if args.seeds < 1:
        raise ConfigError("--seeds", args.seeds, "an integer >= 1 (3 or more for an interval)")
    from .record import PsError

    try:
        result = _run(args, out, rest, ps_values, shlex.join(["trainscale", "ps", "experiment", *argv]))
    except PsError as e:
        print(f"trainscale ps experiment: {e}", file=sys.stderr)
        return 1
    print(result["markdown"])
    print(f"report: {out / (args.kind + '.md')}")
    return 0


def _run(args: argparse.Namespace, out: Path, rest: list[str], ps_values: list[int] | None,
         command: str) -> dict[str, Any]:
    from .session import ray_session

    seeds = list(range(args.seeds))
    with ray_session(args.ray_address):
        if args.kind == "runtime":
            modes = tuple(args.modes.split(",")) if args.modes else RUNTIME_MODES
            return runtime_experiment(out, rest, ps_values or [2, 4, 8], modes, args.mean or 0.2,
                                      args.seconds or 6.0, args.min_updates, args.max_updates, seeds=seeds,
                                      command=command)
        return convergence_experiment(out, rest, (ps_values or [4])[0], args.mean or 0.02, args.seconds or 12.0,
                                      seeds=seeds, command=command)


# ------------------------------------------------------------------------------------------------ runtime


def runtime_experiment(out: Path, overrides: list[str], learners: list[int], modes: tuple[str, ...], mean: float,
                       seconds: float, min_updates: int, max_updates: int, actors: Any = None,
                       seeds: Sequence[int] = (0, 1, 2), command: str = "") -> dict[str, Any]:
    """Measure seconds per update of each mode and P under ``exp:mean`` delays, once per seed; write the report.

    ``actors`` (a PsActors with enough learners) is reused when given, else made and ended here.

    Example::

        runtime_experiment(Path("ps-runtime"), [], [2, 4], ("sync", "async"), 0.05, 2.0, 20, 100, seeds=[0, 1, 2])
    """
    from .actors import PsActors
    from .job import preflight
    from .report import write_runtime

    for m in modes:
        if m not in RUNTIME_MODES:
            raise ConfigError("--modes", m, "one of " + ", ".join(RUNTIME_MODES))
    runs: list[dict[str, Any]] = []
    own = actors is None
    actors = actors or PsActors(max(learners), 1)
    try:
        for seed in seeds:  # the outer loop: a slow spell of the machine spreads over cells, not one cell's seeds
            for p in learners:
                for mode in modes:
                    runs.append(_runtime_run(overrides, seed, p, mode, mean, seconds, min_updates, max_updates,
                                             actors))
    finally:
        if own:
            actors.close()
    numel = sum(p.numel() for p in preflight(load_config([*_SMALL, *overrides])).model.parameters())
    settings = {"command": command or "runtime_experiment(...)", "mean_s": mean, "seconds": seconds,
                "min_updates": min_updates, "max_updates": max_updates, "seeds": list(seeds)}
    return write_runtime(out, runs, settings, numel * 4)


def _runtime_run(overrides: list[str], seed: int, p: int, mode: str, mean: float, seconds: float, min_updates: int,
                 max_updates: int, actors: Any) -> dict[str, Any]:
    """One (seed, P, mode) run: its measured and predicted seconds per update."""
    from .job import preflight, run_ps

    k = 1 if mode == "async" else (p if mode == "sync" else max(1, p // 2))
    predicted = predicted_update_time(mode, p, k, mean)
    n = int(min(max_updates, max(min_updates, math.ceil(seconds / predicted))))
    cfg = load_config([*_SMALL, *overrides, "--ps.mode", mode, "--ps.learners", str(p), "--ps.k", str(k),
                       "--ps.delay", f"exp:{mean}", "--ps.steps", str(n), "--job.seed", str(seed),
                       "--log.progress", "none"])
    s = run_ps(cfg, actors=actors, plan=preflight(cfg))
    measured = s["mean_update_interval_s"]
    c = s["minibatch_overhead_s"] or 0.0
    with_c = predicted_update_time(mode, p, k, mean, shift=c)
    row = {"seed": seed, "P": p, "mode": mode, "K": k, "updates": s["updates"], "predicted_s": predicted,
           "measured_s": measured, "error": measured / predicted - 1, "overhead_s": c,
           "predicted_with_overhead_s": with_c, "error_with_overhead": measured / with_c - 1,
           "bytes_per_update": (s["bytes_pushed"] + s["bytes_pulled"]) / max(1, s["updates"]),
           "staleness_mean": s["staleness_mean"], "wall_s": s["wall_s"]}
    logger.info(f"runtime: seed {seed} P={p} {mode:<13} K={k}  measured {measured * 1e3:7.1f} ms  predicted "
                f"{predicted * 1e3:7.1f} ms  ({row['error']:+.1%}); overhead c {c * 1e3:.1f} ms, "
                f"with c {with_c * 1e3:.1f} ms ({row['error_with_overhead']:+.1%})")
    return row


_SMALL = ["--model.width", "64"]  # delays dominate; a small model keeps 8 learners within 2 cores


# ------------------------------------------------------------------------------------------------ convergence


def convergence_experiment(out: Path, overrides: list[str], learners: int, mean: float, seconds: float,
                           actors: Any = None, seeds: Sequence[int] = (0, 1, 2), command: str = "") -> dict[str, Any]:
    """Eval error against time and updates for the parameter-server modes, once per seed; write the report.

    Example::

        convergence_experiment(Path("ps-convergence"), [], learners=4, mean=0.02, seconds=12, seeds=[0, 1, 2])
    """
    from .actors import PsActors
    from .job import preflight, run_ps
    from .report import write_convergence

    runs: list[dict[str, Any]] = []
    own = actors is None
    actors = actors or PsActors(learners, 1)
    k = max(1, learners // 2)
    try:
        for seed in seeds:
            for mode, rule in CONVERGENCE_RUNS:
                cfg = load_config(["--ps.lr", "0.2", *_SMALL, *overrides, "--ps.mode", mode, "--ps.learners",
                                   str(learners), "--ps.k", str(k), "--ps.lr_rule", rule, "--ps.delay", f"exp:{mean}",
                                   "--ps.time_s", str(seconds), "--ps.eval_every", "5", "--job.seed", str(seed),
                                   "--log.progress", "none"])
                s = run_ps(cfg, actors=actors, plan=preflight(cfg))
                label = f"{mode} ({rule})" if rule != "constant" else mode
                runs.append({"seed": seed, "label": label, "mode": mode, "lr_rule": rule, "K": s["k"],
                             "updates": s["updates"], "staleness_mean": s["staleness_mean"],
                             "eval_accuracy": s["eval_accuracy"], "curve": s["eval_curve"]})
                logger.info(f"convergence: seed {seed} {label:<22} {s['updates']} updates, staleness "
                            f"{s['staleness_mean']:.2f}, eval accuracy {s['eval_accuracy']:.3f}")
    finally:
        if own:
            actors.close()
    settings = {"command": command or "convergence_experiment(...)", "learners": learners, "mean_s": mean,
                "seconds": seconds, "seeds": list(seeds)}
    return write_convergence(out, runs, settings)
