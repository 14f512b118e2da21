"""The actors of a parameter-server job: server shards and learners, with Ray restarting them on failure.

Learner processes import torch, which costs seconds each on a small machine, so one :class:`PsActors` can
serve several runs (experiments, tests): a run uses the first P learners and S shards and sets them up
afresh. By default actors ask for 0 CPUs: they spend their time waiting on injected delays and on each
other, and ``ps.threads`` bounds the threads each learner computes with. On a cluster, ``ps.learner_gpus``
puts each learner on (a share of) a GPU, ``ps.learner_cpus``/``ps.shard_cpus`` reserve cores, and
``ps.placement`` puts the shards in a placement group (spread: one per node where it can, so their
network links add up).

Example::

    actors = PsActors(learners=4, shards=2, placement="spread", learner_gpus=1)
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import ray

from ..log import logger
from .learner import CONCURRENCY, Learner
from .record import PsError
from .shard import ServerShard

__all__ = ["PsActors"]

STRATEGIES = {"pack": "PACK", "spread": "SPREAD", "strict-spread": "STRICT_SPREAD"}
_MIN_BUNDLE_CPU = 0.01  # a placement-group bundle must ask for something; this much never blocks a node


class PsActors:
    """``learners`` learner actors and ``shards`` shard actors; :meth:`close` ends them and their snapshots."""

    def __init__(self, learners: int, shards: int, threads: int = 1, max_restarts: int = 3, snapshot_dir: str = "",
                 learner_gpus: float = 0.0, learner_cpus: float = 0.0, shard_cpus: float = 0.0,
                 placement: str = "none", timeout_s: float = 60.0):
        if not ray.is_initialized():
            raise RuntimeError("Ray is not running: call trainscale.ps.session.ray_session() or ray.init() first")
        self._own_dir = not snapshot_dir
        self.snapshot_dir = Path(snapshot_dir or tempfile.mkdtemp(prefix="trainscale-ps-"))
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        self.threads, self.max_restarts = threads, max_restarts
        self.learner_gpus, self.learner_cpus = learner_gpus, learner_cpus
        self.group = _placement_group(shards, shard_cpus, placement, timeout_s)
        shard_cls = ray.remote(ServerShard)
        self.shards = [shard_cls.options(num_cpus=shard_cpus, max_restarts=max_restarts, max_task_retries=0,
                                         **_in_group(self.group, s)).remote(s, str(self.snapshot_dir / f"shard{s}.npz"))
                       for s in range(shards)]
        self.learners: list = []
        self.grow(learners)

    @classmethod
    def from_config(cls, ps: Any) -> PsActors:
        """The actors a run with this ``PsConfig`` needs."""
        return cls(ps.learners, ps.shards, ps.threads, ps.max_restarts, ps.snapshot_dir, ps.learner_gpus,
                   ps.learner_cpus, ps.shard_cpus, ps.placement, ps.timeout_s)

    def grow(self, learners: int) -> None:
        """Have at least ``learners`` learner actors."""
        learner_cls = ray.remote(Learner).options(num_cpus=self.learner_cpus, num_gpus=self.learner_gpus,
                                                  max_restarts=self.max_restarts, max_task_retries=0,
                                                  max_concurrency=CONCURRENCY)
        while len(self.learners) < learners:
            self.learners.append(learner_cls.remote(len(self.learners), self.threads))

    def fits(self, learners: int, shards: int) -> bool:
        """Whether a run with this many learners and shards can use these actors."""
        return learners <= len(self.learners) and shards <= len(self.shards)

    def close(self) -> None:
        """Kill every actor (no restart), free the placement group, remove the snapshot folder when it is ours."""
        for actor in [*self.learners, *self.shards]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as e:  # already gone
                logger.debug(f"ps: kill failed: {e}")
        self.learners, self.shards = [], []
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
            self.group = None
        if self._own_dir:
            shutil.rmtree(self.snapshot_dir, ignore_errors=True)


def _placement_group(shards: int, cpus: float, placement: str, timeout_s: float) -> Any:
    """One bundle per shard with the ``ps.placement`` strategy, ready within ``timeout_s``; None for none."""
    if placement == "none":
        return None
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": max(cpus, _MIN_BUNDLE_CPU)}] * shards, strategy=STRATEGIES[placement])
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise PsError(f"ps.placement = {placement}: Ray could not place {shards} shard bundles of "
                      f"{max(cpus, _MIN_BUNDLE_CPU):g} CPU within {timeout_s:g} s (strict-spread needs one node "
                      "per shard; see `ray status`)")
    return group


def _in_group(group: Any, bundle: int) -> dict[str, Any]:
    if group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)}
