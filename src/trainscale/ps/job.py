"""One parameter-server run, start to finish: check, build, set up the actors, train, evaluate, summarise.

Example (Ray already running)::

    cfg = load_config(["--ps.mode", "k-sync", "--ps.learners", "4", "--ps.k", "2"])
    summary = run_ps(cfg)
    summary["eval_accuracy"], summary["updates_per_s"]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config import Config, ConfigError, PsConfig
from ..log import logger
from .data import TrainArrays
from .delays import parse_delay
from .policies import resolve_k
from .sharding import Layout, balance

__all__ = ["Plan", "preflight", "run_ps"]


@dataclass
class Plan:
    """What the driver builds before any actor exists: data, model, how it is sharded, initial slices."""

    cfg: Config
    k: int
    model: torch.nn.Module
    layout: Layout
    slices: list[np.ndarray]
    train: TrainArrays
    eval: TrainArrays
    info: Any
    loss: str


def preflight(cfg: Config) -> Plan:
    """Every check that needs no Ray (bad input fails here with one line), and the initial model.

    ``model.name`` and ``data.name`` take what ``trainscale train`` takes, a user's ``package.module:function``
    included (through :func:`~trainscale.models.build_model` and :func:`~trainscale.data.build_datasets`).
    """
    from ..data import build_datasets
    from ..models import build_model, check_name
    from .data import as_arrays, infer_info, loss_name, resolve_loss

    ps = cfg.ps
    check_name(cfg.model.name)
    parse_delay(ps.delay, ps.learners)
    loss = loss_name(cfg)
    resolve_loss(loss)
    train_ds, eval_ds, info = build_datasets(cfg.data)
    train, evals = as_arrays(train_ds), as_arrays(eval_ds)
    if len(train.y) < ps.learners:
        raise ConfigError("data.name", cfg.data.name, f"the training set has {len(train.y)} samples, fewer than "
                          f"ps.learners = {ps.learners}")
    info = info or infer_info(train)
    torch.manual_seed(cfg.job.seed)
    model = build_model(cfg.model.name, info.in_shape, info.num_classes, cfg.model.width, cfg.model.depth)
    params = [p for p in model.parameters() if p.requires_grad]
    layout = balance([tuple(p.shape) for p in params], ps.shards)
    slices = layout.split([p.detach().numpy() for p in params])
    return Plan(cfg, resolve_k(ps.mode, ps.learners, ps.k), model, layout, slices, train, evals, info, loss)


def _learner_spec(plan: Plan, rank: int) -> dict[str, Any]:
    """What learner ``rank`` needs to build its model and its share of the data."""
    cfg = plan.cfg
    return {"model": cfg.model.name, "width": cfg.model.width, "depth": cfg.model.depth,
            "in_shape": list(plan.info.in_shape), "num_classes": plan.info.num_classes,
            "mean": list(plan.info.mean), "std": list(plan.info.std), "shapes": [list(s) for s in plan.layout.shapes],
            "shards": [list(s) for s in plan.layout.shards], "rank": rank, "world": cfg.ps.learners,
            "batch_size": cfg.data.batch_size, "seed": cfg.job.seed, "delay": cfg.ps.delay, "loss": plan.loss,
            "gpu": cfg.ps.learner_gpus > 0}


def _describe(update: int, driver: Any) -> str:
    """The progress line after an update: staleness and loss, or the shards' versions."""
    line = driver.rec.timeline[-1] if driver.rec.timeline else {}
    if "staleness" in line:
        return f"learners {line['learners']}  staleness {line['staleness']}  loss {line['loss']:.4f}"
    return f"shard versions {line.get('versions', [])}"


def run_ps(cfg: Config, actors: Any = None, on_update: Callable[[int, Any], None] | None = None,
           progress: str = "none", plan: Plan | None = None) -> dict[str, Any]:
    """Train with ``cfg.ps`` on Ray (which must be running) and return the summary.

    ``actors`` (a :class:`~trainscale.ps.actors.PsActors`) is reused when given, else created and ended
    here. ``on_update(update, driver)`` is called after every update (tests inject failures from it).
    """
    from .progress import PsProgress

    ps = cfg.ps
    plan = plan or preflight(cfg)
    own = actors is None
    actors = _claim_actors(ps, actors)
    view: Any = None
    try:
        learners, shards = actors.learners[:ps.learners], actors.shards[:ps.shards]
        setup, pids, learner_pids = _start(plan, ps, learners, shards)
        view = PsProgress(None if ps.time_s > 0 else ps.steps, progress, cfg.log.every)

        def hook(update: int, driver: Any) -> None:
            view.update(update, _describe(update, driver))
            if on_update is not None:
                on_update(update, driver)

        driver = _driver(ps, learners, shards, pids, setup, hook, learner_pids)
        logger.info(f"ps: {ps.mode} with {ps.learners} learners (K = {plan.k}), {ps.shards} shard(s), "
                    f"{plan.layout.numel:,} parameters, delay {ps.delay}")
        rec = driver.run()
        view.close()
        return _finish(plan, ps, shards, rec)
    finally:
        if view is not None:
            view.close()
        if own:
            actors.close()


def _claim_actors(ps: PsConfig, actors: Any) -> Any:
    """The actors to train on: new ones for ``ps``, or the given ones, grown when they are too few."""
    from .actors import PsActors

    if actors is None:
        return PsActors.from_config(ps)
    if not actors.fits(ps.learners, ps.shards):
        actors.grow(ps.learners)
        if not actors.fits(ps.learners, ps.shards):
            raise ConfigError("ps.shards", ps.shards, f"these actors have only {len(actors.shards)} shards")
    return actors


def _start(plan: Plan, ps: PsConfig, learners: list, shards: list) -> tuple[Callable[[int], Any], list[int], list[int]]:
    """Reset the shards to the initial slices and set up the learners; (set-up of learner i, their PIDs)."""
    import ray

    inputs, targets = ray.put(plan.train.x), ray.put(plan.train.y)

    def setup(i: int) -> Any:
        return learners[i].setup.remote(_learner_spec(plan, i), inputs, targets)

    opts = {"lr": ps.lr, "lr_rule": ps.lr_rule, "snapshot_every": ps.snapshot_every,
            "keep_history": ps.lr_rule == "distance", "optimizer": "adagrad" if ps.mode == "downpour" else "sgd"}
    # Learners import torch when they start: give the first set-up longer than a normal wait.
    startup_s = ps.timeout_s + 20.0 * ps.learners
    metas = _wait_all([sh.reset.remote(sl, opts) for sh, sl in zip(shards, plan.slices)], startup_s, "server shards")
    learner_metas = _wait_all([setup(i) for i in range(ps.learners)], startup_s, "learners")
    return setup, [m["pid"] for m in metas], [m["pid"] for m in learner_metas]


def _driver(ps: PsConfig, learners: list, shards: list, pids: list[int], setup: Callable[[int], Any],
            hook: Callable[[int, Any], None], learner_pids: list[int]) -> Any:
    """The loop that runs ``ps.mode``: DOWNPOUR's driver, or the coordinator of the synchronous and async modes."""
    import ray

    from .coordinator import Coordinator
    from .downpour import DownpourDriver

    if ps.mode == "downpour":
        return DownpourDriver(ps, learners, shards, pids, setup, hook, learner_pids)
    params = [sh.get.options(num_returns=2).remote()[1] for sh in shards]
    shard_ids = ray.get([sh.actor_id.remote() for sh in shards], timeout=ps.timeout_s)
    return Coordinator(ps, learners, shards, params, pids, setup, hook, learner_pids, shard_ids)


def _finish(plan: Plan, ps: PsConfig, shards: list, rec: Any) -> dict[str, Any]:
    """Evaluate the final parameters and the kept points, and summarise the run."""
    import ray

    from .summary import evaluate, summarize

    final = [sh.get.options(num_returns=2).remote()[1] for sh in shards]

    def scores(refs: list) -> tuple[float | None, float | None]:
        return evaluate(plan.model, plan.layout, ray.get(refs, timeout=ps.timeout_s), plan.eval, plan.info, plan.loss)

    curve = _eval_curve(rec.eval_points, scores)
    eval_loss, eval_accuracy = scores(final)
    return summarize(ps, plan.k, rec, eval_accuracy, curve, eval_loss, plan.layout.numel)


def _eval_curve(points: list, scores: Callable[[list], tuple]) -> list[dict[str, Any]]:
    """Eval loss and accuracy at the kept points; a point whose parameters a dead shard lost is left out."""
    from ray.exceptions import RayActorError, RayTaskError

    curve = []
    for u, t, refs in points:
        try:
            loss, acc = scores(refs)
        except (RayActorError, RayTaskError):
            logger.warning(f"ps: the parameters of update {u} were lost with a shard; left out of the eval curve")
            continue
        curve.append({"update": u, "t": round(t, 6), "accuracy": acc, "loss": loss})
    return curve


def _wait_all(refs: list, timeout_s: float, what: str) -> list:
    """The results of ``refs``; ``PsError`` naming ``what`` when some are not ready within ``timeout_s``."""
    import ray

    from .record import PsError

    ready, rest = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if rest:
        raise PsError(f"{len(rest)} of {len(refs)} {what} did not start within {timeout_s:.0f} s")
    return ray.get(ready, timeout=timeout_s)
