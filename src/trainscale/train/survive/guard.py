"""The run's survival kit in one object: watchdog, preemption, injected faults, restart bookkeeping.

What the step sees is ``mark`` (attribute writes) and ``at_boundary`` (a bool test while no SIGTERM came).
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

import torch.distributed as dist

from ...config import Config
from ...distributed import DistEnv
from ...distributed.watchdog import Watchdog, raw_store
from ...log import logger
from .faults import Fault, fault_from_env
from .preempt import Preemption

__all__ = ["Guard"]


def _watchdog_store(timeout_s: float) -> Any:
    """A store connection of the watchdog's own (its thread must not share the main thread's socket)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not (addr and port):
        return None
    return dist.TCPStore(addr, int(port), is_master=False, timeout=datetime.timedelta(seconds=max(10.0, timeout_s)),
                         wait_for_workers=False)


class Guard:
    """Keeps a run alive or ends it with a name (see the module docstring)."""

    def __init__(self, cfg: Config, env: DistEnv):
        self.rank, self.world = env.rank, env.world_size
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.fault: Fault | None = fault_from_env(env.rank)
        launched = env.world_size > 1 and dist.is_initialized()
        self.store = raw_store(dist.distributed_c10d._get_default_store()) if launched else None
        lead = 1 + (cfg.strategy.local_sgd_period if cfg.strategy.local_sgd_period else 0)
        self.preempt = Preemption(self.store, env.rank, env.world_size, self.attempt, lead)
        self.watchdog: Watchdog | None = None
        self.timeout_s = cfg.job.timeout_s
        if launched and cfg.job.heartbeat_s > 0:
            self.watchdog = Watchdog(self.side_store(), env.rank, env.world_size, cfg.job.timeout_s, cfg.job.heartbeat_s,
                                     self.attempt)
            self.watchdog.on_beat = self.preempt.poll_store  # a SIGTERM that reached another rank only
        self.started = False

    def side_store(self) -> Any:
        """A store connection for a side thread (the watchdog's, the straggler monitor's); None when not launched."""
        if self.store is None:
            return None
        try:
            return _watchdog_store(self.timeout_s) or self.store
        except Exception as e:  # no second connection: use the main one (the store serialises calls)
            logger.debug(f"side store: {e}")
            return self.store

    def start(self) -> None:
        """Start beating (after the first collective: every rank's key exists by then)."""
        if self.watchdog is not None and not self.started:
            self.watchdog.start()
        self.started = True

    def mark(self, phase: str, step: int, detail: str = "") -> None:
        """The main thread reached ``phase`` of the step after ``step``."""
        if self.watchdog is not None:
            self.watchdog.mark(phase, step, detail)

    def at_boundary(self, step: int) -> bool:
        """Between steps: inject a fault if one is due; True when the job must stop here (preempted)."""
        if self.fault is not None:
            self.fault.hit(step)
        return self.preempt.requested and self.preempt.should_stop(step)

    def in_checkpoint(self, step: int) -> None:
        """Halfway through this rank's checkpoint write: inject a checkpoint fault if one is due."""
        if self.fault is not None:
            self.fault.hit(step, "checkpoint")

    def record_resume(self, step: int) -> None:
        """Rank 0 notes where this attempt resumed (for the next attempt's count of steps redone)."""
        if self.store is not None and self.rank == 0:
            self.store.set(f"trainscale/{self.attempt}/resumed", str(step))

    def steps_redone(self, start_step: int) -> int:
        """Steps done by earlier attempts after the checkpoint that the next attempt resumed from."""
        if self.store is None or self.attempt == 0:
            return 0
        redone = 0
        for a in range(self.attempt):
            keys = [f"trainscale/{a}/hb/{r}" for r in range(self.world)]
            if not self.store.check(keys):
                continue
            reached = max(json.loads(v)["step"] for v in self.store.multi_get(keys))
            nxt = f"trainscale/{a + 1}/resumed"
            resumed = int(self.store.get(nxt)) if a + 1 < self.attempt and self.store.check([nxt]) else start_step
            redone += max(0, reached - resumed)
        return redone

    def close(self) -> None:
        """Stop the watchdog and give SIGTERM back."""
        if self.watchdog is not None:
            self.watchdog.stop()
        self.preempt.uninstall()
