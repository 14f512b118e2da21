"""The coordinator of the six coordinated modes: executes a :class:`Policy` on Ray actors.

Gradients and parameters never pass through the coordinator: a learner returns one object per shard,
the coordinator hands those references to the shards, and the shards' results (the new parameters) go
as references to the learners. The coordinator only moves small metadata and decides, and it never
waits on a shard in the course of an update: the shards' small answers are collected every
``HARVEST_S`` without blocking (a shard that answers nothing within ``ps.timeout_s`` ends the run).
Every wait is a ``ray.wait`` with a timeout. A learner that dies is noticed through its failed task,
restarted by Ray, set up again in the background and launched when it is back; it is counted as
restarted when it comes back in a new process. A shard that dies restores its snapshot; the learners
whose parameters it lost (their task fails on that argument) are launched again on its restored ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError, TaskCancelledError

from ..config import PsConfig
from ..log import logger
from .lr_rules import coefficients
from .policies import Apply, Cancel, Launch, Policy
from .record import PsError, RunRecord
from .retry import get_when_back

__all__ = ["Coordinator"]

HARVEST_S = 0.05  # how often the shards' answers are collected: rare enough to cost nothing per update


class Coordinator:
    """Runs one coordinated-mode job on ``learners`` and ``shards`` (actor handles) until steps or time.

    ``learner_ids``/``shard_ids`` are the actors' Ray ids (to tell a shard's failure, seen in a learner's
    task through its argument, from the learner's own); ``learner_pids`` their processes at the start.
    """

    def __init__(self, cfg: PsConfig, learners: list, shards: list, params: list, shard_pids: list[int],
                 setup: Callable[[int], Any], on_update: Callable[[int, Coordinator], None] | None = None,
                 learner_pids: list[int] | None = None, shard_ids: list[str] | None = None):
        self.cfg, self.learners, self.shards, self.params = cfg, learners, shards, list(params)
        self.shard_pids = list(shard_pids)
        self.learner_pids = list(learner_pids) if learner_pids else [0] * len(learners)
        self.shard_ids = {sid: s for s, sid in enumerate(shard_ids or [])}
        self.setup, self.on_update = setup, on_update
        self.policy = Policy(cfg.mode, len(learners), cfg.k)
        self.rec = RunRecord()
        self.pending: dict[Any, tuple[Launch, list]] = {}  # meta ref -> (its launch, grad refs)
        self.by_ticket: dict[int, Any] = {}
        self.arrived: dict[int, tuple[list, dict]] = {}  # ticket -> (grad refs, meta), until applied
        self.setups: dict[Any, int] = {}  # setup ref -> learner being brought back
        self.stop_requested = False
        self.lost_at: dict[int, float] = {}  # learner -> when it was lost (monotonic), until it is back
        self.submitted: dict[int, float] = {}  # ticket -> perf_counter at launch
        self.checks: dict[Any, tuple[int, int, float]] = {}  # shard answer ref -> (shard, version, submitted)
        self.last_harvest = 0.0
        # Method handles with their options made once: building them costs on every call of a hot loop.
        self._compute = [lr.compute.options(num_returns=len(shards) + 1) for lr in learners]
        self._apply_on = [sh.apply.options(num_returns=2) for sh in shards]

    def request_stop(self) -> None:
        """End the run after the current update (from ``on_update``)."""
        self.stop_requested = True

    # ------------------------------------------------------------------------------------ main loop

    def run(self) -> RunRecord:
        """Train until ``ps.steps`` updates (or ``ps.time_s`` seconds); returns the record."""
        cfg, rec = self.cfg, self.rec
        rec.t0 = self.last_harvest = time.perf_counter()
        self._execute(self.policy.start())
        deadline = cfg.time_s if cfg.time_s > 0 else None
        try:
            while not self._done(deadline):
                wait_s = cfg.timeout_s if deadline is None else max(0.01, min(cfg.timeout_s, deadline - rec.now()))
                if self.checks:
                    wait_s = min(wait_s, HARVEST_S)  # the shards' answers are due: look again soon
                ready, _ = ray.wait([*self.pending, *self.setups], num_returns=1, timeout=wait_s)
                t_ready = time.perf_counter()
                if t_ready - self.last_harvest >= HARVEST_S:
                    self._harvest(t_ready)
                if not ready:
                    if wait_s < cfg.timeout_s:  # a short wait (deadline, harvest), not a stall
                        continue
                    raise PsError(f"no gradient arrived within ps.timeout_s = {cfg.timeout_s:g} s after update "
                                  f"{rec.updates} ({len(self.pending)} mini-batches in flight on learners "
                                  f"{sorted(v[0].learner for v in self.pending.values())}, "
                                  f"{len(self.setups)} restarting)")
                for ref in ready:
                    if ref in self.setups:
                        self._rejoined(ref)
                    else:
                        self._arrived(ref, t_ready)
                rec.add_time("coordinator", time.perf_counter() - t_ready)
        finally:
            self._drain()
        rec.wall_s = rec.now()
        return rec

    def _drain(self) -> None:
        """Leave no mini-batch running behind the run: interrupt the last ones and wait (bounded) until they end.

        They are interrupted (their delay ends, their compute finishes) rather than cancelled with ``ray.cancel``:
        cancelling a task that Ray is still resolving arguments for can block the tasks queued behind it on
        the same actor (ray-project/ray#60850), which would hang the next run on these actors. The shards'
        last answers are collected too, so a restart in the last updates is counted.
        """
        if self.pending:
            for action, _ in self.pending.values():
                self.learners[action.learner].interrupt.remote(action.ticket)
            _, rest = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=self.cfg.timeout_s,
                               fetch_local=False)
            if rest:
                logger.warning(f"ps: {len(rest)} mini-batches did not end within ps.timeout_s after the run")
        self.pending.clear()
        if self.checks:
            ray.wait(list(self.checks), num_returns=len(self.checks), timeout=self.cfg.timeout_s)
            self._harvest(time.perf_counter())

    def _done(self, deadline: float | None) -> bool:
        if self.stop_requested:
            return True
        if deadline is not None:
            return self.rec.now() >= deadline
        return self.rec.updates >= self.cfg.steps

    # ------------------------------------------------------------------------------------ events

    def _arrived(self, ref: Any, t_ready: float) -> None:
        action, grads = self.pending.pop(ref)
        ticket, learner = action.ticket, action.learner
        self.by_ticket.pop(ticket, None)
        sent = self.submitted.pop(ticket, None)
        try:
            meta = ray.get(ref, timeout=self.cfg.timeout_s)
        except TaskCancelledError:
            return
        except (RayActorError, RayTaskError) as e:
            shard = self.shard_ids.get(getattr(e, "actor_id", None) or "")
            if shard is not None:
                # An argument (parameters) from a shard that died: the learner never ran it. Bring the
                # shard's parameters back and run the same work again on them.
                self._recover_shard(shard)
                self._launch(action)
            elif isinstance(e, RayActorError):
                self._lost(learner, f"died ({type(e).__name__})")
            else:
                self._lost(learner, f"failed: {str(e).strip().splitlines()[-1]}", error="NotSetUp" not in str(e))
            return
        rec = self.rec
        rec.bytes_pushed += meta["pushed"]
        rec.bytes_pulled += meta["pulled"]
        self.arrived[ticket] = (grads, meta)
        if sent is not None:
            # What a mini-batch costs besides its injected delay: launch, fetch, compute, push, notice.
            rec.overheads.append(t_ready - sent - meta["delay_s"])
            rec.add_time("learner_wait", meta["t_start"] - sent)
            rec.add_time("learner_load", meta["load_s"])
            rec.add_time("learner_compute", meta["compute_s"] - meta["load_s"])
            rec.add_time("learner_return", t_ready - meta["t_end"])
        self._execute(self.policy.arrive(ticket))

    def _lost(self, learner: int, why: str, error: bool = False) -> None:
        """A learner's work failed: drop it, and bring the learner back with a fresh set-up (once per loss)."""
        if learner in self.lost_at:
            # Work launched before the loss was seen fails too: the same loss, already being handled.
            logger.debug(f"ps: learner {learner} {why} (already rejoining)")
            return
        if error:
            self.rec.errors += 1
        logger.warning(f"ps: learner {learner} {why}; its work is dropped and it rejoins on the current parameters")
        self._execute(self.policy.lost(learner))
        self.lost_at[learner] = time.monotonic()
        self.setups[self.setup(learner)] = learner

    def _rejoined(self, ref: Any) -> None:
        learner = self.setups.pop(ref)
        try:
            meta = ray.get(ref, timeout=self.cfg.timeout_s)
        except ActorUnavailableError:
            # Ray is still restarting it: ask again (each try fails fast) until ps.timeout_s since it was lost.
            if time.monotonic() - self.lost_at[learner] < self.cfg.timeout_s:
                time.sleep(0.05)
                self.setups[self.setup(learner)] = learner
                return
            self._give_up(learner, "did not come back within ps.timeout_s")
            return
        except (RayActorError, RayTaskError, GetTimeoutError) as e:
            self._give_up(learner, f"cannot come back ({type(e).__name__})")
            return
        del self.lost_at[learner]
        if meta["pid"] != self.learner_pids[learner]:
            # One restart per new process, however many of its tasks failed on the way.
            self.learner_pids[learner] = meta["pid"]
            self.rec.learner_restarts += 1
            logger.warning(f"ps: learner {learner} is back (restarted, pid {meta['pid']})")
        self._execute(self.policy.rejoin(learner))

    def _give_up(self, learner: int, why: str) -> None:
        logger.error(f"ps: learner {learner} {why}; continuing without it")
        self.lost_at.pop(learner, None)
        try:
            self._execute(self.policy.remove(learner))
        except RuntimeError as gone:
            raise PsError(str(gone)) from None

    # ------------------------------------------------------------------------------------ actions

    def _execute(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Apply):
                self._apply(action)
            elif isinstance(action, Cancel):
                ref = self.by_ticket.pop(action.ticket, None)
                if ref is not None:
                    self.pending.pop(ref, None)
                    self.submitted.pop(action.ticket, None)
                    # The learner ends the work's delay (or skips it) and its result is dropped unread.
                    self.learners[action.learner].interrupt.remote(action.ticket)
                    self.rec.cancelled += 1
            elif isinstance(action, Launch):
                self._launch(action)

    def _launch(self, action: Launch) -> None:
        refs = self._compute[action.learner].remote(action.version, action.ticket, *self.params)
        self.pending[refs[0]] = (action, list(refs[1:]))
        self.submitted[action.ticket] = time.perf_counter()
        self.by_ticket[action.ticket] = refs[0]

    def _apply(self, action: Apply) -> None:
        cfg, rec = self.cfg, self.rec
        taken = [self.arrived.pop(g.ticket) for g in action.grads]
        sq = self._sq_distances([g.version for g in action.grads]) if cfg.lr_rule == "distance" else None
        coefs = coefficients(cfg.lr_rule, cfg.lr, action.staleness, sq, cfg.lr_c, cfg.lr_max)
        keep_from = self.policy.oldest_version()
        calls = [apply.remote(action.version, coefs, keep_from, *[grads[s] for grads, _ in taken])
                 for s, apply in enumerate(self._apply_on)]
        # The new parameters go to the learners as references at once; the shards' small answers are
        # collected later by _harvest, so no update waits for a shard's round trip.
        self.params = [params_ref for _, params_ref in calls]
        t = time.perf_counter()
        for s, (meta_ref, _) in enumerate(calls):
            self.checks[meta_ref] = (s, action.version, t)
        rec.updates = action.version
        rec.update_times.append(rec.now())
        rec.staleness += list(action.staleness)
        loss = sum(m["loss"] for _, m in taken) / len(taken)
        rec.losses.append(loss)
        rec.timeline.append({"update": action.version, "t": round(rec.update_times[-1], 6),
                             "learners": [g.learner for g in action.grads], "staleness": list(action.staleness),
                             "lr": [round(c * len(coefs), 8) for c in coefs], "loss": round(loss, 6)})
        if cfg.eval_every and action.version % cfg.eval_every == 0:
            rec.eval_points.append((action.version, rec.update_times[-1], list(self.params)))
        if self.on_update is not None:
            self.on_update(action.version, self)

    # ------------------------------------------------------------------------------------ shards

    def _harvest(self, now: float) -> None:
        """Collect the shards' answers that are in, without waiting; a shard silent for ps.timeout_s fails the run."""
        self.last_harvest = now
        if not self.checks:
            return
        ready, rest = ray.wait(list(self.checks), num_returns=len(self.checks), timeout=0)
        try:
            metas = ray.get(ready, timeout=self.cfg.timeout_s)  # one call for all: they are in already
        except RayActorError:
            metas = [self._shard_call(self.checks[ref][0], ref) for ref in ready]  # find the dead shard's
        for ref, meta in zip(ready, metas):
            s, version, sent = self.checks.pop(ref)
            if meta is None:
                self._recover_shard(s)
                continue
            self.rec.add_time("shard_wait", meta["t_start"] - sent)
            self.rec.add_time("shard_apply", meta["t_end"] - meta["t_start"])
            self._check_pid(s, meta, version - 1)
        oldest = min((self.checks[r][2] for r in rest), default=now)
        if now - oldest > self.cfg.timeout_s:
            s = self.checks[rest[0]][0]
            raise PsError(f"server shard {s} did not answer within ps.timeout_s = {self.cfg.timeout_s:g} s")

    def _recover_shard(self, s: int) -> None:
        """Shard ``s`` died: wait until Ray has restarted it (from its snapshot) and take its parameters."""
        self.params[s] = self._refetch(s)

    def _sq_distances(self, versions: list[int]) -> list[float]:
        parts = [self._shard_call(s, sh.sqdist.remote(versions)) for s, sh in enumerate(self.shards)]
        return [sum(p[i] for p in parts if p is not None) for i in range(len(versions))]

    def _shard_call(self, s: int, ref: Any) -> Any:
        """The result of a shard call, or None when the shard died during it (it is restarting)."""
        try:
            return ray.get(ref, timeout=self.cfg.timeout_s)
        except RayActorError:
            return None
        except GetTimeoutError:
            raise PsError(f"server shard {s} did not answer within ps.timeout_s = {self.cfg.timeout_s:g} s") from None

    def _refetch(self, s: int) -> Any:
        """After shard ``s`` died: wait for Ray to restart it (it restores its snapshot) and take its parameters."""
        refs: list = []

        def call() -> Any:
            refs[:] = self.shards[s].get.options(num_returns=2).remote()
            return refs[0]

        meta = get_when_back(call, self.cfg.timeout_s, f"server shard {s}")
        self._check_pid(s, meta, self.policy.version)
        return refs[1]

    def _check_pid(self, s: int, meta: dict, expected: int) -> None:
        """A new process id means Ray restarted the shard: it restored a snapshot, count what was lost."""
        if meta["pid"] != self.shard_pids[s]:
            self.shard_pids[s] = meta["pid"]
            restored = meta["restored_from"] if meta["restored_from"] is not None else 0
            self._shard_restored(s, restored, expected)

    def _shard_restored(self, s: int, restored: int, expected: int) -> None:
        lost = max(0, expected - restored)
        self.rec.shard_restarts += 1
        self.rec.updates_lost += lost
        logger.warning(f"ps: server shard {s} restarted from its snapshot at version {restored}; "
                       f"{lost} of its updates were lost")
