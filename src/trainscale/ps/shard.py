"""A server shard: owns one flat slice of the parameters and applies the optimizer to it (a Ray actor).

Plain numpy, no torch, so a shard starts in a fraction of a second. The shard writes a snapshot every
``snapshot_every`` updates to a file; when Ray restarts the actor after a crash, ``__init__`` reads that
file back; every answer carries the process id and ``restored_from`` (the version the latest restart
restored), so the driver sees a new pid and counts the updates lost.

Coordinated modes call :meth:`apply` (SGD with coefficients chosen by the coordinator); Downpour's
learners call :meth:`push` directly, and the shard runs Adagrad on its own (Dean et al. 2012).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

__all__ = ["ServerShard"]


class ServerShard:
    """One shard of the parameter server; ``snapshot_path`` survives the actor's restarts."""

    def __init__(self, shard_id: int, snapshot_path: str):
        self.id, self.path = shard_id, snapshot_path
        self.params: np.ndarray | None = None
        self.accum: np.ndarray | None = None
        self.version = 0
        self.restored_from: int | None = None  # the version the latest restart restored
        self.history: dict[int, np.ndarray] = {}
        self.opts: dict[str, Any] = {}
        self.stale_sum, self.stale_count, self.stale_max = 0, 0, 0
        self._step: np.ndarray | None = None  # apply's scratch buffer, the size of the slice
        if os.path.exists(self.path):
            self._restore()

    # ---------------------------------------------------------------------------------- life cycle

    def reset(self, params: np.ndarray, opts: dict[str, Any]) -> dict[str, Any]:
        """Start a run: ``opts`` has lr, lr_rule, snapshot_every, keep_history (and Adagrad's eps)."""
        self.params = np.array(params, dtype=np.float32, copy=True)
        self.accum = np.zeros_like(self.params) if opts.get("optimizer") == "adagrad" else None
        self.opts, self.version, self.restored_from = dict(opts), 0, None
        self.history = {0: self.params.copy()} if opts.get("keep_history") else {}
        self.stale_sum, self.stale_count, self.stale_max = 0, 0, 0
        self._snapshot()
        return self._meta()

    def _snapshot(self) -> None:
        # Write then rename, so a crash mid-write leaves the previous snapshot intact.
        tmp = f"{self.path}.tmp.npz"
        np.savez(tmp, params=self._ready(), accum=self.accum if self.accum is not None else np.zeros(0, np.float32),
                 state=np.array([self.version, self.stale_sum, self.stale_count, self.stale_max], dtype=np.int64),
                 opts=np.array(repr(self.opts)))
        os.replace(tmp, self.path)

    def _restore(self) -> None:
        import ast

        with np.load(self.path) as z:
            self.params = z["params"].copy()
            self.accum = z["accum"].copy() if z["accum"].size else None
            self.version, self.stale_sum, self.stale_count, self.stale_max = (int(v) for v in z["state"])
            self.opts = ast.literal_eval(str(z["opts"]))
        self.restored_from = self.version
        self.history = {self.version: self.params.copy()} if self.opts.get("keep_history") else {}

    def _meta(self) -> dict[str, Any]:
        meta = {"shard": self.id, "version": self.version, "restored_from": self.restored_from, "pid": os.getpid(),
                "stale_sum": self.stale_sum, "stale_count": self.stale_count, "stale_max": self.stale_max}
        return meta

    def actor_id(self) -> str | None:
        """Ray's id of this actor (a learner's task that failed on this shard's result names it); None outside one."""
        import ray

        return ray.get_runtime_context().get_actor_id()

    # ---------------------------------------------------------------------------------- calls

    def info(self) -> dict[str, Any]:
        """Version, staleness counters, pid and the version restored at the latest restart (or None)."""
        return self._meta()

    def get(self) -> tuple[dict[str, Any], np.ndarray]:
        """(meta, parameters); call with ``num_returns=2`` so the parameters travel as their own object."""
        params = self._ready()
        return self._meta(), params

    def sqdist(self, versions: list[int]) -> list[float]:
        """``||w_now - w_v||^2`` of this slice for each version (the oldest kept one if ``v`` was pruned)."""
        params = self._ready()
        out = []
        for v in versions:
            old = self.history.get(v)
            if old is None:
                old = self.history[min(self.history)] if self.history else params
            d = params - old
            out.append(float(np.dot(d, d)))
        return out

    def apply(self, version: int, coefs: list[float], keep_from: int, *grads: np.ndarray) -> tuple[dict, np.ndarray]:
        """SGD step ``w -= sum_i coefs[i] * grads[i]``; the result is version ``version``. Returns (meta, w)."""
        t_start = time.perf_counter()
        params = self._ready()  # self.params itself: updated in place
        if len(coefs) != len(grads):
            raise ValueError(f"{len(coefs)} coefficients for {len(grads)} gradients")
        step = self._scratch(params)
        for c, g in zip(coefs, grads):
            np.multiply(g, np.float32(c), out=step)  # into a kept buffer: no temporary of the slice's size
            params -= step
        self.version = version
        if self.opts.get("keep_history"):
            self.history[version] = params.copy()
            for v in [v for v in self.history if v < keep_from]:
                del self.history[v]
        if version % int(self.opts.get("snapshot_every", 50)) == 0:
            self._snapshot()
        meta = self._meta()
        meta["t_start"], meta["t_end"] = t_start, time.perf_counter()
        return meta, params

    def _scratch(self, params: np.ndarray) -> np.ndarray:
        if self._step is None or self._step.shape != params.shape:
            self._step = np.empty_like(params)
        return self._step

    def push(self, grad: np.ndarray, version: int) -> int:
        """Downpour: apply one learner's gradient at once with Adagrad; returns the new version."""
        params = self._ready()  # self.params itself: updated in place
        staleness = max(0, self.version - version)
        self.stale_sum, self.stale_count = self.stale_sum + staleness, self.stale_count + 1
        self.stale_max = max(self.stale_max, staleness)
        lr = float(self.opts["lr"])
        if self.opts.get("lr_rule") == "staleness":
            lr /= max(1, staleness)
        if self.accum is None:
            params -= np.float32(lr) * grad
        else:
            # Adagrad per parameter, on this shard alone: no shard ever waits for another (Downpour SGD, Dean et al. 2012).
            self.accum += grad * grad
            params -= np.float32(lr) * grad / (np.sqrt(self.accum) + np.float32(self.opts.get("eps", 1e-8)))
        self.version += 1
        if self.version % int(self.opts.get("snapshot_every", 50)) == 0:
            self._snapshot()
        return self.version

    def pid(self) -> int:
        """Process id (tests kill it)."""
        return os.getpid()

    def _ready(self) -> np.ndarray:
        """The parameters, or a clear error before the first ``reset``."""
        if self.params is None:
            raise RuntimeError(f"server shard {self.id} has no parameters: reset() was never called")
        return self.params
