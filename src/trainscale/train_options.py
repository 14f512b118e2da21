"""The options of ``trainscale train``: its argument parser, and ``parse``, which turns them into a checked Config.

Below the run so that the lab's job launcher (``jobs``) checks a job's options before anything starts, with the
same parser the job will use, without importing the run.

Example::

    args, cfg = parse(["--nproc", "2", "--steps", "50", "--strategy.bucket_mb", "0"])
    cfg.job.steps, args.nproc  # (50, 2)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .config import Config, ConfigError, field_options, load_config

__all__ = ["parse", "SHORT", "SECTIONS", "EPILOG"]

SHORT = {"model": "model.name", "data": "data.name", "steps": "job.steps", "batch_size": "data.batch_size"}

SECTIONS = ("job", "model", "data", "optim", "strategy", "checkpoint", "log", "ablate")

EPILOG = """Every field can also be set in --config FILE ([section] tables); --section.field VALUE overrides it.

examples:
  trainscale train --nproc 2                                  # the embedded default: mlp on digits, 2 processes
  trainscale train --nproc 2 --model resnet18 --model.width 16 --data synthetic --steps 50
  trainscale train --nproc 2 --strategy.bucket_mb 0 --strategy.overlap false --json run.json
  trainscale launch --nproc-per-node 4 -m trainscale train --config job.toml   # under an existing launcher
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainscale train", formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
        usage="trainscale train [--config FILE] [--nproc N] [--json PATH] [--section.field VALUE ...]",
        description="Train a model with synchronous data parallelism (DDP, one process per device).", epilog=EPILOG)
    for name, doc, opts in field_options(SECTIONS):
        group = p.add_argument_group(f"[{name}] " + doc.rstrip(".").replace("``", ""))
        for flag, text in opts:
            # Kept as strings and SUPPRESSed when absent: the config layer coerces, validates and layers them.
            group.add_argument(flag, dest=flag[2:], metavar="VALUE", default=argparse.SUPPRESS, help=text)
    p.add_argument("--config", metavar="FILE", help="TOML file with [section] tables")
    p.add_argument("--nproc", type=int, metavar="N",
                   help="launch N processes on this machine (ignored when already started by a launcher)")
    p.add_argument("--model", help="model name (model.name)")
    p.add_argument("--data", help="dataset name (data.name)")
    p.add_argument("--steps", help="optimizer steps (job.steps)")
    p.add_argument("--batch-size", dest="batch_size", help="samples per process per micro-step (data.batch_size)")
    p.add_argument("--json", metavar="PATH", help="write the run summary as one JSON object")
    p.add_argument("--profile", action="store_true",
                   help="torch.profiler: rank 0's per-operator table and every rank's Chrome trace, into job.out or "
                        "beside --json (log.profile)")
    p.add_argument("--timeline", action="store_true",
                   help="per-rank timeline.json (Chrome trace / Perfetto) in job.out or beside --json (log.timeline)")
    p.add_argument("--resume", metavar="PATH",
                   help="continue from a checkpoint: a step_N.pt file, a sharded step_N/ folder, a checkpoint folder "
                        "(its newest complete checkpoint), or auto: the newest in checkpoint.dir, a fresh start if none")
    p.add_argument("--max-restarts", dest="max_restarts", type=int, default=0, metavar="K",
                   help="with --nproc: torchrun restarts the whole group up to K times after a rank fails; each "
                        "restart resumes from the newest checkpoint in checkpoint.dir")
    p.add_argument("--print-config", action="store_true", help="print the resolved configuration as TOML and exit")
    return p


def parse(argv: list[str]) -> tuple[argparse.Namespace, Config]:
    """Split short options from ``--section.field`` overrides and build the validated Config."""
    args, rest = _parser().parse_known_args(argv)
    fields = {k: v for k, v in vars(args).items() if "." in k}  # --section.field VALUE, in command-line order
    for k in fields:
        delattr(args, k)
    rest = [*(x for k, v in fields.items() for x in (f"--{k}", v)), *rest]
    extra = {key: getattr(args, short) for short, key in SHORT.items() if getattr(args, short) is not None}
    if args.profile:
        extra["log.profile"] = True
    if args.timeline:
        extra["log.timeline"] = True
    cfg = load_config(rest, args.config, extra)
    if args.nproc is not None and args.nproc < 1:
        raise ConfigError("--nproc", args.nproc, "must be >= 1")
    if cfg.ablate.sleep_times and not Path(cfg.ablate.sleep_times).is_file():
        raise ConfigError("ablate.sleep_times", cfg.ablate.sleep_times, "no such file (a sleep_times.json written by "
                          "an earlier --ablate.compute sleep run)")
    warm = cfg.log.skip_first + (0 if cfg.ablate.sleep_times else cfg.ablate.calibrate_steps)
    if cfg.ablate.compute == "sleep" and cfg.job.steps <= warm:
        raise ConfigError("job.steps", cfg.job.steps, f"must exceed the {warm} unmeasured warm-up/calibration steps "
                          "(log.skip_first + ablate.calibrate_steps)")
    cycle = len(cfg.ablate.phase_list()) * cfg.ablate.phase_steps
    if cycle and cfg.job.steps < cfg.log.skip_first + cycle:
        raise ConfigError("job.steps", cfg.job.steps, f"too few for ablate.phases: give at least log.skip_first + one "
                          f"cycle of phases x ablate.phase_steps = {cfg.log.skip_first + cycle}")
    if args.max_restarts < 0:
        raise ConfigError("--max-restarts", args.max_restarts, "must be >= 0")
    if args.resume == "auto" and not cfg.checkpoint.dir:
        raise ConfigError("--resume", "auto", "needs checkpoint.dir (--checkpoint.dir FOLDER), where it looks")
    return args, cfg
