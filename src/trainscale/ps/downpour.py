"""Downpour SGD (Dean et al. 2012): no coordinator; this driver only starts learners, watches and stops.

Learners fetch from and push to every shard on their own (:mod:`.downpour_loop`); each shard applies
Adagrad alone. The driver polls the shards' versions (to stop at ``ps.steps`` and draw the timeline), and
watches the learners' loops: one that dies is restarted by Ray, set up again and sent back to work, which
costs its share of the data for a while and nothing else, as Downpour promises.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

from ..config import PsConfig
from ..log import logger
from .record import PsError, RunRecord
from .retry import get_when_back

__all__ = ["DownpourDriver"]

POLL_S = 0.05


class DownpourDriver:
    """Runs Downpour on ``learners`` and ``shards`` until the slowest shard has ``ps.steps`` updates (or time)."""

    def __init__(self, cfg: PsConfig, learners: list, shards: list, shard_pids: list[int], setup: Callable[[int], Any],
                 on_update: Callable[[int, DownpourDriver], None] | None = None,
                 learner_pids: list[int] | None = None):
        self.cfg, self.learners, self.shards, self.setup, self.on_update = cfg, learners, shards, setup, on_update
        self.shard_pids = list(shard_pids)
        self.learner_pids = list(learner_pids) if learner_pids else [0] * len(learners)
        self.rec = RunRecord()
        self.versions = [0] * len(shards)
        self.runs: dict[Any, int] = {}
        self.setups: dict[Any, int] = {}
        self.stats: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(learners))}
        self.stop_requested = False
        self.lost_at: dict[int, float] = {}

    def request_stop(self) -> None:
        """End the run at the next poll (from ``on_update``)."""
        self.stop_requested = True

    def _start(self, i: int) -> None:
        # The loop's own limit is only a backstop in case this driver vanishes; the driver stops it first.
        max_s = (self.cfg.time_s or 0) + 4 * self.cfg.timeout_s + 3600
        ref = self.learners[i].run_downpour.remote(self.shards, self.cfg.fetch_every, self.cfg.push_every, max_s,
                                                   self.cfg.timeout_s)
        self.runs[ref] = i

    def run(self) -> RunRecord:
        """Train, then stop every learner and gather its counters."""
        cfg, rec = self.cfg, self.rec
        rec.t0 = time.perf_counter()
        for i in range(len(self.learners)):
            self._start(i)
        last_progress, infos = rec.now(), []
        try:
            while True:
                infos = self._poll_shards()
                low = min(self.versions)
                if low > rec.updates:
                    t = rec.now()
                    rec.update_times += [t] * (low - rec.updates)
                    rec.updates, last_progress = low, t
                    rec.timeline.append({"update": low, "t": round(t, 6), "versions": list(self.versions)})
                    if cfg.eval_every and low // cfg.eval_every > len(rec.eval_points):
                        rec.eval_points.append((low, t, self._params()))
                    if self.on_update is not None:
                        self.on_update(low, self)
                if self.stop_requested or (cfg.time_s > 0 and rec.now() >= cfg.time_s) or (
                        cfg.time_s <= 0 and low >= cfg.steps):
                    break
                if rec.now() - last_progress > cfg.timeout_s:
                    raise PsError(f"no shard update within ps.timeout_s = {cfg.timeout_s:g} s "
                                  f"({len(self.runs)} learners running, {len(self.setups)} restarting)")
                self._watch_learners()
        finally:
            self._stop_all()
        infos = self._poll_shards()
        rec.stale_stats = (sum(i["stale_sum"] for i in infos), sum(i["stale_count"] for i in infos),
                           max(i["stale_max"] for i in infos))
        rec.updates = min(self.versions)
        rec.wall_s = rec.now()
        self._gather_losses()
        return rec

    # -------------------------------------------------------------------------------- shards

    def _poll_shards(self) -> list[dict[str, Any]]:
        refs = [s.info.remote() for s in self.shards]
        infos = []
        for s, ref in enumerate(refs):
            try:
                info = ray.get(ref, timeout=self.cfg.timeout_s)
            except RayActorError:
                info = self._shard_back(s)
            except GetTimeoutError:
                raise PsError(f"server shard {s} did not answer within ps.timeout_s = {self.cfg.timeout_s:g} s") from None
            if info["pid"] != self.shard_pids[s]:  # Ray restarted it from its snapshot
                self.shard_pids[s] = info["pid"]
                self._restored(s, info["restored_from"] if info["restored_from"] is not None else 0)
            self.versions[s] = info["version"]
            infos.append(info)
        return infos

    def _shard_back(self, s: int) -> dict[str, Any]:
        return get_when_back(self.shards[s].info.remote, self.cfg.timeout_s, f"server shard {s}")

    def _restored(self, s: int, restored: int) -> None:
        lost = max(0, self.versions[s] - restored)
        self.rec.shard_restarts += 1
        self.rec.updates_lost += lost
        logger.warning(f"ps: server shard {s} restarted from its snapshot at version {restored}; "
                       f"at least {lost} of its updates were lost")

    def _params(self) -> list:
        return [s.get.options(num_returns=2).remote()[1] for s in self.shards]

    # -------------------------------------------------------------------------------- learners

    def _watch_learners(self) -> None:
        watched = [*self.runs, *self.setups]
        ready, _ = ray.wait(watched, num_returns=len(watched), timeout=POLL_S)
        for ref in ready:
            if ref in self.setups:
                i = self.setups.pop(ref)
                try:
                    meta = ray.get(ref, timeout=self.cfg.timeout_s)
                except ActorUnavailableError:
                    if time.monotonic() - self.lost_at.get(i, 0.0) < self.cfg.timeout_s:
                        self.setups[self.setup(i)] = i  # still restarting: ask again
                        continue
                    logger.error(f"ps: learner {i} did not come back within ps.timeout_s; continuing without it")
                    if not self.runs and not self.setups:
                        raise PsError("no learner is left") from None
                    continue
                except (RayActorError, RayTaskError, GetTimeoutError) as e:
                    logger.error(f"ps: learner {i} cannot come back ({type(e).__name__}); continuing without it")
                    if not self.runs and not self.setups:
                        raise PsError("no learner is left") from None
                    continue
                self.lost_at.pop(i, None)
                if meta["pid"] != self.learner_pids[i]:  # one restart per new process
                    self.learner_pids[i] = meta["pid"]
                    self.rec.learner_restarts += 1
                self._start(i)
                continue
            i = self.runs.pop(ref)
            try:
                self.stats[i].append(ray.get(ref, timeout=self.cfg.timeout_s))
                self._start(i)  # its loop ended on its own backstop; keep it working
            except (RayActorError, RayTaskError) as e:
                if not isinstance(e, RayActorError) and "NotSetUp" not in str(e):
                    self.rec.errors += 1
                logger.warning(f"ps: learner {i} lost ({type(e).__name__}); it restarts and rejoins with the "
                               "current parameters")
                self.lost_at.setdefault(i, time.monotonic())
                self.setups[self.setup(i)] = i

    def _stop_all(self) -> None:
        for i in set(self.runs.values()):
            self.learners[i].stop.remote()
        for ref in list(self.setups):
            ray.cancel(ref)
        if self.runs:
            ready, rest = ray.wait(list(self.runs), num_returns=len(self.runs), timeout=self.cfg.timeout_s)
            for ref in ready:
                try:
                    self.stats[self.runs[ref]].append(ray.get(ref, timeout=self.cfg.timeout_s))
                except (RayActorError, RayTaskError):
                    pass
            for ref in rest:
                ray.cancel(ref)
        self.runs.clear()

    def _gather_losses(self) -> None:
        rec = self.rec
        firsts, lasts = [], []
        for chunks in self.stats.values():
            losses = [x for c in chunks for x in c["losses"]]
            rec.bytes_pushed += sum(c["bytes_pushed"] for c in chunks)
            rec.bytes_pulled += sum(c["bytes_pulled"] for c in chunks)
            if losses:
                firsts.append(losses[0])
                tail = losses[-max(1, len(losses) // 10):]
                lasts.append(sum(tail) / len(tail))
        rec.loss_first = sum(firsts) / len(firsts) if firsts else None
        rec.loss_last = sum(lasts) / len(lasts) if lasts else None
