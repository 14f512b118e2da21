"""The coordinator of the six coordinated modes: executes a :class:`Policy` on Ray actors.

Gradients and parameters never pass through the coordinator: a learner returns one object per shard,
the coordinator hands those references to the shards, and the shards' results (the new parameters) go
as references to the learners. The coordinator only moves small metadata and decides. Every wait is a
``ray.wait`` with a timeout; a learner that dies is noticed through its failed task, restarted by Ray,
set up again in the background and launched when it is back; a shard that dies restores its snapshot.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError, TaskCancelledError

from ..config import PsConfig
from ..log import logger
from .lr_rules import coefficients
from .policies import Apply, Cancel, Launch, Policy
from .record import PsError, RunRecord
from .retry import get_when_back

__all__ = ["Coordinator"]


class Coordinator:
    """Runs one coordinated-mode job on ``learners`` and ``shards`` (actor handles) until steps or time."""

    def __init__(self, cfg: PsConfig, learners: list, shards: list, params: list, shard_pids: list[int],
                 setup: Callable[[int], Any], on_update: Callable[[int, "Coordinator"], None] | None = None):
        self.cfg, self.learners, self.shards, self.params = cfg, learners, shards, list(params)
        self.shard_pids = list(shard_pids)
        self.setup, self.on_update = setup, on_update
        self.policy = Policy(cfg.mode, len(learners), cfg.k)
        self.rec = RunRecord()
        self.pending: dict[Any, tuple[int, int, list]] = {}  # meta ref -> (ticket, learner, grad refs)
        self.by_ticket: dict[int, Any] = {}
        self.arrived: dict[int, tuple[list, dict]] = {}  # ticket -> (grad refs, meta), until applied
        self.setups: dict[Any, int] = {}  # setup ref -> learner being brought back
        self.stop_requested = False
        self.lost_at: dict[int, float] = {}  # learner -> when it was lost (monotonic), until it is back
        self.submitted: dict[int, float] = {}  # ticket -> perf_counter at launch
        self.unchecked: tuple[int, list] | None = None  # (version, shard calls) of an update not yet confirmed

    def request_stop(self) -> None:
        """End the run after the current update (from ``on_update``)."""
        self.stop_requested = True

    # ------------------------------------------------------------------------------------ main loop

    def run(self) -> RunRecord:
        """Train until ``ps.steps`` updates (or ``ps.time_s`` seconds); returns the record."""
        cfg, rec = self.cfg, self.rec
        rec.t0 = time.perf_counter()
        self._execute(self.policy.start())
        deadline = cfg.time_s if cfg.time_s > 0 else None
        try:
            while not self._done(deadline):
                wait_s = cfg.timeout_s if deadline is None else max(0.01, min(cfg.timeout_s, deadline - rec.now()))
                ready, _ = ray.wait([*self.pending, *self.setups], num_returns=1, timeout=wait_s)
                if not ready:
                    if wait_s < cfg.timeout_s:  # a short wait up to the --time deadline, not a stall
                        continue
                    raise PsError(f"no gradient arrived within ps.timeout_s = {cfg.timeout_s:g} s after update "
                                  f"{rec.updates} ({len(self.pending)} mini-batches in flight on learners "
                                  f"{sorted(v[1] for v in self.pending.values())}, {len(self.setups)} restarting)")
                for ref in ready:
                    if ref in self.setups:
                        self._rejoined(ref)
                    else:
                        self._arrived(ref)
        finally:
            self._drain()
        rec.wall_s = rec.now()
        return rec

    def _drain(self) -> None:
        """Leave no mini-batch running behind the run: let the last ones finish, cancel what is left.

        Cancelling a task that Ray is still resolving arguments for can block the tasks queued behind it
        on the same actor (ray-project/ray#60850), which would hang the next run on these actors; the
        mini-batches of the last launch are exactly such tasks, so they are waited for (bounded) instead.
        """
        if self.pending:
            _, rest = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=self.cfg.timeout_s,
                               fetch_local=False)
            for ref in rest:
                ray.cancel(ref)
        self.pending.clear()

    def _done(self, deadline: float | None) -> bool:
        if self.stop_requested:
            return True
        if deadline is not None:
            return self.rec.now() >= deadline
        return self.rec.updates >= self.cfg.steps

    # ------------------------------------------------------------------------------------ events

    def _arrived(self, ref: Any) -> None:
        ticket, learner, grads = self.pending.pop(ref)
        self.by_ticket.pop(ticket, None)
        try:
            meta = ray.get(ref, timeout=self.cfg.timeout_s)
        except TaskCancelledError:
            return
        except RayActorError as e:
            self._lost(learner, f"died ({type(e).__name__})")
            return
        except RayTaskError as e:
            self._lost(learner, f"failed: {str(e).strip().splitlines()[-1]}", error=True)
            return
        self.rec.bytes_pushed += meta["pushed"]
        self.rec.bytes_pulled += meta["pulled"]
        self.arrived[ticket] = (grads, meta)
        # What a mini-batch costs besides its injected delay: launch, fetch, compute, push, notice.
        sent = self.submitted.pop(ticket, None)
        if sent is not None:
            self.rec.overheads.append(time.perf_counter() - sent - meta["delay_s"])
        self._execute(self.policy.arrive(ticket))

    def _lost(self, learner: int, why: str, error: bool = False) -> None:
        """A learner's work failed: drop it, and bring the learner back with a fresh set-up."""
        restarted = "NotSetUp" in why or not error
        if restarted:
            self.rec.learner_restarts += 1
        else:
            self.rec.errors += 1
        logger.warning(f"ps: learner {learner} {why}; its work is dropped and it rejoins on the current parameters")
        self._execute(self.policy.lost(learner))
        self.lost_at.setdefault(learner, time.monotonic())
        self.setups[self.setup(learner)] = learner

    def _rejoined(self, ref: Any) -> None:
        learner = self.setups.pop(ref)
        try:
            ray.get(ref, timeout=self.cfg.timeout_s)
        except ActorUnavailableError:
            # Ray is still restarting it: ask again (each try fails fast) until ps.timeout_s since it was lost.
            if time.monotonic() - self.lost_at.get(learner, 0.0) < self.cfg.timeout_s:
                time.sleep(0.05)
                self.setups[self.setup(learner)] = learner
                return
            self._give_up(learner, "did not come back within ps.timeout_s")
            return
        except (RayActorError, RayTaskError, GetTimeoutError) as e:
            self._give_up(learner, f"cannot come back ({type(e).__name__})")
            return
        self.lost_at.pop(learner, None)
        self._execute(self.policy.rejoin(learner))

    def _give_up(self, learner: int, why: str) -> None:
        logger.error(f"ps: learner {learner} {why}; continuing without it")
        try:
            self._execute(self.policy.remove(learner))
        except RuntimeError as gone:
            raise PsError(str(gone)) from None

    # ------------------------------------------------------------------------------------ actions

    def _execute(self, actions: list) -> None:
        launched: list[Launch] = []
        for action in actions:
            if isinstance(action, Apply):
                self._apply(action)
            elif isinstance(action, Cancel):
                ref = self.by_ticket.pop(action.ticket, None)
                if ref is not None:
                    self.pending.pop(ref, None)
                    self.submitted.pop(action.ticket, None)
                    ray.cancel(ref)
                    self.rec.cancelled += 1
            elif isinstance(action, Launch):
                self._launch(action)
                launched.append(action)
        if self.unchecked:
            self._check_apply(launched)

    def _check_apply(self, launched: list[Launch]) -> None:
        """Wait for the shards' small answers to the last update, after the learners were launched.

        The learners got the new parameters as references before the shards answered, so the server's
        round trip overlaps their start. A shard that died during the update is waited for (it restores
        its snapshot) and the mini-batches just launched on its lost result are sent again.
        """
        version, calls = self.unchecked
        self.unchecked = None
        broken = False
        for s, (meta_ref, _) in enumerate(calls):
            meta = self._shard_call(s, meta_ref)
            if meta is None:
                self.params[s] = self._refetch(s)
                broken = True
            else:
                self._check_pid(s, meta, version - 1)
        if not broken:
            return
        if self.rec.eval_points and self.rec.eval_points[-1][0] == version:
            u, t, _ = self.rec.eval_points[-1]
            self.rec.eval_points[-1] = (u, t, list(self.params))
        for action in launched:
            ref = self.by_ticket.pop(action.ticket, None)
            if ref is not None:
                self.pending.pop(ref, None)
                ray.cancel(ref)
                self._launch(action)

    def _launch(self, action: Launch) -> None:
        learner = self.learners[action.learner]
        refs = learner.compute.options(num_returns=len(self.shards) + 1).remote(
            action.version, action.ticket, *self.params)
        self.pending[refs[0]] = (action.ticket, action.learner, list(refs[1:]))
        self.submitted[action.ticket] = time.perf_counter()
        self.by_ticket[action.ticket] = refs[0]

    def _apply(self, action: Apply) -> None:
        cfg, rec = self.cfg, self.rec
        taken = [self.arrived.pop(g.ticket) for g in action.grads]
        sq = self._sq_distances([g.version for g in action.grads]) if cfg.lr_rule == "distance" else None
        coefs = coefficients(cfg.lr_rule, cfg.lr, action.staleness, sq, cfg.lr_c, cfg.lr_max)
        keep_from = self.policy.oldest_version()
        calls = [shard.apply.options(num_returns=2).remote(action.version, coefs, keep_from,
                                                           *[grads[s] for grads, _ in taken])
                 for s, shard in enumerate(self.shards)]
        # The new parameters go to the learners as references at once; _check_apply waits for the shards'
        # small answers after the launches, so failures stay visible without a round trip on the way.
        self.params = [params_ref for _, params_ref in calls]
        self.unchecked = (action.version, calls)
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
