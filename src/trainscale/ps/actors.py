"""The actors of a parameter-server job: server shards and learners, with Ray restarting them on failure.

Learner processes import torch, which costs seconds each on a small machine, so one :class:`PsActors` can
serve several runs (experiments, tests): a run uses the first P learners and S shards and sets them up
afresh. Actors ask for 0 CPUs: they spend their time waiting on injected delays and on each other, and
``ps.threads`` bounds the threads each learner computes with.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import ray

from ..log import logger
from .learner import Learner
from .shard import ServerShard

__all__ = ["PsActors"]


class PsActors:
    """``learners`` learner actors and ``shards`` shard actors; :meth:`close` ends them and their snapshots."""

    def __init__(self, learners: int, shards: int, threads: int = 1, max_restarts: int = 3, snapshot_dir: str = ""):
        if not ray.is_initialized():
            raise RuntimeError("Ray is not running: call trainscale.ps.session.ray_session() or ray.init() first")
        self._own_dir = not snapshot_dir
        self.snapshot_dir = Path(snapshot_dir or tempfile.mkdtemp(prefix="trainscale-ps-"))
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        self.threads, self.max_restarts = threads, max_restarts
        shard_cls = ray.remote(ServerShard).options(num_cpus=0, max_restarts=max_restarts, max_task_retries=0)
        self.shards = [shard_cls.remote(s, str(self.snapshot_dir / f"shard{s}.npz")) for s in range(shards)]
        self.learners: list = []
        self.grow(learners)

    def grow(self, learners: int) -> None:
        """Have at least ``learners`` learner actors."""
        learner_cls = ray.remote(Learner).options(num_cpus=0, max_restarts=self.max_restarts, max_task_retries=0,
                                                  max_concurrency=16)
        while len(self.learners) < learners:
            self.learners.append(learner_cls.remote(len(self.learners), self.threads))

    def fits(self, learners: int, shards: int) -> bool:
        """Whether a run with this many learners and shards can use these actors."""
        return learners <= len(self.learners) and shards <= len(self.shards)

    def close(self) -> None:
        """Kill every actor (no restart) and remove the snapshot folder when it is ours."""
        for actor in [*self.learners, *self.shards]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as e:  # already gone
                logger.debug(f"ps: kill failed: {e}")
        self.learners, self.shards = [], []
        if self._own_dir:
            shutil.rmtree(self.snapshot_dir, ignore_errors=True)
