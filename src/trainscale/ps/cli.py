"""``trainscale ps``: parameter-server training on Ray, and ``trainscale ps experiment runtime|convergence``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import Config, ConfigError, config_to_toml, describe_fields, load_config

__all__ = ["main", "parse"]

SHORT = {"mode": "ps.mode", "learners": "ps.learners", "k": "ps.k", "shards": "ps.shards", "lr_rule": "ps.lr_rule",
         "delay": "ps.delay", "steps": "ps.steps", "time": "ps.time_s", "model": "model.name", "data": "data.name"}

EPILOG = """Any configuration field can be set as --section.field VALUE (after --config FILE, which it overrides):
{fields}

modes (P learners, K = --k): sync (wait for all P), k-sync (first K learners, cancel the rest), k-batch-sync
(first K mini-batches from any learners, cancel the rest), async (every gradient at once), k-async (K learners,
cancel nothing), k-batch-async (K mini-batches, cancel nothing), downpour (no coordinator, Adagrad per shard).

examples:
  trainscale ps --mode k-sync --learners 4 --k 2 --delay exp:0.05 --steps 200 --json ps.json
  trainscale ps --mode async --learners 8 --lr-rule staleness --time 30
  trainscale ps --mode downpour --learners 4 --shards 3 --ps.fetch_every 2 --ps.push_every 2
  trainscale ps experiment runtime --out ps-runtime          # time per update against order statistics
  trainscale ps experiment convergence --out ps-convergence  # eval error against time and updates
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainscale ps", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Parameter-server training on Ray: server shards, learners, and the synchronisation policies "
                    "of Dutta et al. (AISTATS 2018).",
        epilog=EPILOG.format(fields=describe_fields(("ps", "model", "data", "job", "log"))))
    p.add_argument("--config", metavar="FILE", help="TOML file with [section] tables")
    p.add_argument("--mode", help="synchronisation policy (ps.mode)")
    p.add_argument("--learners", metavar="P", help="learner actors (ps.learners)")
    p.add_argument("--k", metavar="K", help="K of the k-* modes (ps.k)")
    p.add_argument("--shards", metavar="S", help="server shards (ps.shards)")
    p.add_argument("--lr-rule", dest="lr_rule", help="constant | staleness | distance (ps.lr_rule)")
    p.add_argument("--delay", metavar="SPEC", help="none | exp:MEAN | shifted-exp:SHIFT,MEAN | slow:RANK,FACTOR")
    p.add_argument("--steps", metavar="N", help="server updates to run (ps.steps)")
    p.add_argument("--time", metavar="S", help="run for S seconds instead of --steps (ps.time_s)")
    p.add_argument("--model", help="model name (model.name)")
    p.add_argument("--data", help="dataset name (data.name)")
    p.add_argument("--json", metavar="PATH", help="write the run summary as one JSON object")
    p.add_argument("--ray-address", metavar="ADDR", help="join a running Ray cluster (default: a local instance)")
    p.add_argument("--print-config", action="store_true", help="print the resolved configuration as TOML and exit")
    return p


def parse(argv: list[str]) -> tuple[argparse.Namespace, Config]:
    """Short options and ``--section.field`` overrides into a validated Config."""
    args, rest = _parser().parse_known_args(argv)
    extra = {key: getattr(args, short) for short, key in SHORT.items() if getattr(args, short) is not None}
    cfg = load_config(rest, args.config, extra)
    if args.json and Path(args.json).is_dir():
        raise ConfigError("--json", args.json, "is a folder; give a file path for the summary")
    return args, cfg


def main(argv: list[str]) -> int:
    """Entry of ``trainscale ps``."""
    if argv and argv[0] == "experiment":
        from .experiments import main as experiment_main
        return experiment_main(argv[1:])
    from ..log import setup_logging
    from .job import preflight, run_ps
    from .record import PsError
    from .session import ray_session

    args, cfg = parse(argv)
    if args.print_config:
        print(config_to_toml(cfg, ("ps", "model", "data", "job")))
        return 0
    setup_logging(cfg.log.level, rank=0)
    plan = preflight(cfg)  # bad input ends here, before Ray starts
    try:
        with ray_session(args.ray_address, verbose=cfg.log.level == "debug"):
            summary = run_ps(cfg, progress=cfg.log.progress, plan=plan)
    except PsError as e:
        print(f"trainscale ps: {e}", file=sys.stderr)
        return 1
    _print_summary(summary)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def _print_summary(s: dict) -> None:
    score = (f"eval accuracy {s['eval_accuracy']:.3f}" if s.get("eval_accuracy") is not None else
             f"eval loss {s['eval_loss']:.4f}" if s.get("eval_loss") is not None else "no eval set")
    print(f"{s['mode']}: P={s['learners']} K={s['k']} S={s['shards']}  {s['updates']} updates in {s['wall_s']:.2f} s "
          f"({s['updates_per_s']:.1f}/s, {s['mean_update_interval_s'] * 1e3:.1f} ms each)  "
          f"staleness mean {s['staleness_mean']:.2f} max {s['staleness_max']}  "
          f"loss {s['loss_first']:.3f} -> {s['loss_last']:.3f}  {score}  "
          f"restarts {s['restarts']} (updates lost {s['updates_lost']})")
