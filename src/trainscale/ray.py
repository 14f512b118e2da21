"""Ray Train for the synchronous path: a run-API training function or script on Ray Train's ``TorchTrainer``.

Ray Train starts one worker per rank, places the workers on the Ray cluster's nodes and joins them in a torch
process group (Gloo on CPUs, NCCL with ``use_gpu``) before the function runs. ``trainscale.init()`` inside the
function finds that group and joins it (the cluster resolver's ``ray`` source reads Ray Train's ``NODE_RANK``
beside torchrun's variables), so every strategy, experiment switch and measurement works as under
``trainscale launch``. Configuration overrides reach every rank through ``TRAINSCALE_ARGS``, as the lab's do.

    python -m trainscale.ray --num-workers 2 examples/classify_digits.py --steps 200
"""

from __future__ import annotations

import argparse
import os
import runpy
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import ConfigError
from .log import logger
from .train.run import ENV_ARGS

__all__ = ["RayConfig", "fit", "main"]

TrainFn = Callable[[], Any]


@dataclass(frozen=True)
class RayConfig:
    """Where and how Ray Train runs the job."""

    num_workers: int = 2  # ranks: one Ray Train worker each, placed by Ray across the cluster's nodes
    use_gpu: bool = False  # one GPU per worker (Ray Train then makes an NCCL group)
    cpus_per_worker: float = 1.0  # Ray's CPU reservation per worker; it also sets the worker's OMP_NUM_THREADS
    args: tuple[str, ...] = ()  # --section.field value overrides for every rank (before the lab's TRAINSCALE_ARGS)
    env: Mapping[str, str] = field(default_factory=dict)  # variables set in every worker before the function runs
    address: str | None = None  # the Ray cluster to join; None: RAY_ADDRESS, else a local one started and ended here
    storage_path: str | None = None  # Ray Train's run directory (None: Ray's default, ~/ray_results)
    name: str = ""  # Ray Train's run name ("": trainscale-<time>)

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ConfigError("ray.num_workers", self.num_workers, "must be >= 1")
        if self.cpus_per_worker <= 0:
            raise ConfigError("ray.cpus_per_worker", self.cpus_per_worker, "must be > 0")


def fit(train: TrainFn | str | os.PathLike, argv: Sequence[str] = (), config: RayConfig | None = None) -> Any:
    """Run ``train`` (a function, or a run-API script's path run as ``__main__`` with ``argv``) on every worker.

    Returns Ray Train's ``Result``; a failed worker raises Ray Train's error. Ray is started (and shut down) here
    unless this process is already connected to a Ray cluster or ``config.address`` names one.

    Example::

        import trainscale.ray

        trainscale.ray.fit("examples/classify_digits.py", ["--steps", "200"],
                           trainscale.ray.RayConfig(num_workers=4, use_gpu=True,
                                                    args=("--strategy.shard_optimizer", "true")))
    """
    cfg = config or RayConfig()
    script = None if callable(train) else Path(train).resolve()
    if script is not None and not script.is_file():
        raise ConfigError("script", str(train), "no such file")
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    started = not ray.is_initialized()
    if started:
        ray.init(address=cfg.address, include_dashboard=False)
    try:
        loop = {"train": train if script is None else None, "script": str(script) if script else None,
                "argv": list(argv), "env": worker_env(cfg, os.environ)}
        trainer = TorchTrainer(_worker, train_loop_config=loop,
                               scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                                            resources_per_worker={"CPU": cfg.cpus_per_worker}),
                               run_config=RunConfig(name=cfg.name or f"trainscale-{time.strftime('%Y%m%d-%H%M%S')}",
                                                    storage_path=cfg.storage_path))
        return trainer.fit()
    finally:
        if started:
            ray.shutdown()  # ends the workers and, for a local instance, every Ray process this call started


def worker_env(cfg: RayConfig, driver: Mapping[str, str]) -> dict[str, str]:
    """The variables every worker sets: the driver's ``TRAINSCALE_*`` (the lab's switches), then ``cfg``'s.

    Workers inherit the raylet's environment, not this process's, so the lab's switches must travel explicitly.
    ``cfg.args`` go before the lab's ``TRAINSCALE_ARGS``, which win, as in ``trainscale.init``.
    """
    env = {k: v for k, v in driver.items() if k.startswith("TRAINSCALE_")}
    env.update(cfg.env)
    env[ENV_ARGS] = " ".join(s for s in (shlex.join(cfg.args), env.get(ENV_ARGS, "")) if s)
    return env


def _worker(loop: dict[str, Any]) -> None:
    """One Ray Train worker: the job's variables, then the function or the script as ``__main__``."""
    os.environ.update(loop["env"])
    if loop["script"] is None:
        loop["train"]()
        return
    sys.argv = [loop["script"], *loop["argv"]]
    try:
        runpy.run_path(loop["script"], run_name="__main__")
    except SystemExit as e:  # a script's sys.exit(0) is a success; anything else fails the worker, and the job
        if e.code not in (0, None):
            raise RuntimeError(f"{loop['script']} exited with {e.code}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainscale.ray [--num-workers N] [--use-gpu] SCRIPT ARGS...``: a run-API script on Ray Train."""
    p = argparse.ArgumentParser(prog="python -m trainscale.ray", description=main.__doc__)
    p.add_argument("--num-workers", type=int, default=2, help="ranks (Ray Train workers)")
    p.add_argument("--use-gpu", action="store_true", help="one GPU per worker")
    p.add_argument("--cpus-per-worker", type=float, default=1.0, help="Ray CPUs reserved per worker")
    p.add_argument("--address", default=None, help="Ray cluster to join (default: RAY_ADDRESS, else a local one)")
    p.add_argument("--storage-path", default=None, help="Ray Train's run directory")
    p.add_argument("script", help="a script on the run API")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    a = p.parse_args(argv)
    try:
        cfg = RayConfig(a.num_workers, a.use_gpu, a.cpus_per_worker, address=a.address, storage_path=a.storage_path)
        result = fit(a.script, a.args, cfg)
    except ConfigError as e:
        print(f"python -m trainscale.ray: {e}", file=sys.stderr)
        return 2
    if getattr(result, "error", None) is not None:
        logger.error(f"Ray Train run failed: {result.error}")
        return 1
    return 0


if __name__ == "__main__":
    from trainscale.ray import main as _main  # the package's module, so workers unpickle _worker by reference

    sys.exit(_main())
