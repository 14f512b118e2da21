"""``trainscale train``: parse the configuration, check it, then train here or launch N processes."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..config import Config, ConfigError, config_to_toml
from ..train_options import _parser, parse  # noqa: F401 - the parser lives below jobs, which reads it too

__all__ = ["main", "parse"]

def preflight(args: argparse.Namespace, cfg: Config) -> None:
    """Checks that need this machine (device, amp, checkpoint), made once before any rank starts."""
    from ..data import available_datasets, check_data
    from ..data.datasets import import_data_builder
    from ..distributed.env import resolve_backend, resolve_device
    from ..models import check_name
    from ..models.losses import resolve_loss
    from ..strategies import check_amp, check_strategy, check_transport
    from .report.trackers import check_tracker

    check_name(cfg.model.name)
    if ":" in cfg.data.name:
        import_data_builder(cfg.data.name)  # a user's package.module:function must import
    elif cfg.data.name not in available_datasets():
        raise ConfigError("data.name", cfg.data.name, "one of " + ", ".join(available_datasets())
                          + ", or a builder package.module:function")
    check_data(cfg.data)
    check_tracker(cfg.log.tracker)
    resolve_loss(cfg.job.loss)
    device = resolve_device(cfg.job.device)
    world = args.nproc or 1  # the processes this command will start on this machine
    backend = resolve_backend(cfg.job.backend, device, world)
    check_amp(cfg.strategy.amp, device)
    check_strategy(cfg.strategy, world, world)
    check_transport(cfg.strategy, device.type, backend)
    if cfg.strategy.pipeline_stages > 1:
        _check_pipeline_layers(cfg)
    if cfg.strategy.fsdp or cfg.strategy.activation_checkpointing:
        _check_units(cfg)
    if args.resume and args.resume != "auto":
        _check_resume(Path(args.resume))
    if args.json and Path(args.json).is_dir():
        raise ConfigError("--json", args.json, "is a folder; give a file path for the summary")


def _check_pipeline_layers(cfg: Config) -> None:
    """More stages than layers, or split names the model does not have: refused before any process starts."""
    from ..models import build_model
    from ..strategies.layers import pipeline_layers
    from ..strategies.split import named_split

    s, d = cfg.strategy, cfg.data
    try:  # the layer count does not depend on the input shape; a builder that needs the real one is checked later
        model = build_model(cfg.model.name, (d.channels, d.image_size, d.image_size), d.num_classes,
                            cfg.model.width, cfg.model.depth)
        names = [layer.name for layer in pipeline_layers(model)]
    except Exception:
        return
    chunks = s.pipeline_stages * s.stages_per_rank
    if len(names) < chunks:
        raise ConfigError("strategy.pipeline_stages", s.pipeline_stages, f"more stages ({chunks} model chunks) than "
                          f"{cfg.model.name}'s {len(names)} layers ({', '.join(names)})")
    if s.split not in ("auto", "uniform", "params"):
        try:
            named_split(names, [n.strip() for n in s.split.split(",")], chunks)
        except ValueError as e:
            raise ConfigError("strategy.split", s.split, str(e)) from None


def _check_units(cfg: Config) -> None:
    """``strategy.fsdp_modules`` that name no module of the model: refused before any process starts."""
    from ..models import build_model
    from ..strategies.fsdp import shard_units

    d = cfg.data
    try:  # as for the pipeline: a builder that needs the real input shape is checked in the ranks
        model = build_model(cfg.model.name, (d.channels, d.image_size, d.image_size), d.num_classes,
                            cfg.model.width, cfg.model.depth)
    except Exception:
        return
    shard_units(model, cfg.strategy.fsdp_modules)


def _check_resume(path: Path) -> None:
    """An explicit --resume must name a readable checkpoint, or a folder that holds one."""
    from .checkpoint.dcp import read_meta
    from .checkpoint.files import checkpoint_candidates, is_sharded, load_checkpoint

    if is_sharded(path):
        try:
            read_meta(path)
        except Exception as e:
            raise ConfigError("--resume", str(path), f"not a readable sharded checkpoint: {e}") from None
    elif path.is_dir():
        if not checkpoint_candidates(path):
            raise ConfigError("--resume", str(path), "no checkpoint in this folder (step_N.pt, step_N/ or last.pt)")
    else:
        load_checkpoint(path)


def _strip_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--nproc", "--max-restarts"):
            skip = True
        elif not a.startswith(("--nproc=", "--max-restarts=")):
            out.append(a)
    return out


def main(argv: list[str]) -> int:
    """Entry of ``trainscale train``."""
    args, cfg = parse(argv)  # before torch is imported: bad input is answered in a fraction of a second
    from ..distributed.env import is_launched

    if args.print_config:
        print(config_to_toml(cfg))
        return 0
    if not is_launched():
        preflight(args, cfg)
    if args.nproc and args.nproc > 1 and not is_launched():
        from ..distributed.launcher import LaunchFailed, LaunchSpec, Preempted, launch
        from ..distributed.watchdog import EXIT_HUNG
        from .survive.preempt import EXIT_PREEMPTED

        spec = LaunchSpec(script="trainscale", module=True, args=["train", *_strip_nproc(argv)],
                          nproc_per_node=args.nproc, threads=cfg.job.threads, print_table=False,
                          max_restarts=args.max_restarts, shutdown_timeout=cfg.job.preempt_grace_s)
        try:
            launch(spec)
        except Preempted:
            print(f"trainscale train: preempted; {_resume_hint(cfg)}", file=sys.stderr)
            return EXIT_PREEMPTED
        except LaunchFailed as e:
            if e.exitcodes and all(c == 2 for c in e.exitcodes.values()):
                return 2  # bad input met at run time: the ranks printed its one line
            print(f"trainscale train: {e}", file=sys.stderr)
            return EXIT_HUNG if EXIT_HUNG in e.exitcodes.values() else 2
        return 0
    return _run_rank(args, cfg)


def _resume_hint(cfg: Config) -> str:
    if not cfg.checkpoint.dir:
        return "no checkpoint.dir, nothing saved"
    from .checkpoint.files import read_latest
    latest = read_latest(Path(cfg.checkpoint.dir))
    return f"checkpoint {Path(cfg.checkpoint.dir) / latest if latest else cfg.checkpoint.dir}; continue with --resume auto"


def _run_rank(args: argparse.Namespace, cfg: Config) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    from ..distributed import shutdown
    from .checkpoint.files import CheckpointWriteError
    from .errors import RunError
    from .survive.preempt import EXIT_PREEMPTED
    from .trainer import Trainer

    @record  # a failing rank's traceback reaches torchrun, which ends the other ranks and reports it
    def run() -> int:
        try:
            summary = Trainer(cfg, resume=args.resume, json_path=args.json).fit()  # its run tears the group down
        except (ConfigError, RunError) as e:  # bad input met only at run time (a loss that is not a scalar)
            if not isinstance(e, CheckpointWriteError) or os.environ.get("RANK", "0") == "0":  # one line per job
                print(f"trainscale train: {e}", file=sys.stderr)
            return 2  # the exit code of every bad-input error
        finally:
            shutdown()
        if summary.get("preempted"):
            if "LOCAL_RANK" not in os.environ:  # under the launcher, the launcher says it once
                print(f"trainscale train: preempted at step {summary.get('steps')}; {_resume_hint(cfg)}",
                      file=sys.stderr)
            return EXIT_PREEMPTED
        return 0

    code = run()
    return 0 if code is None else code  # record turns a SystemExit(0) inside run into None
