"""Inside a Downpour learner: compute on the last parameters fetched, while fetches and pushes fly beside it.

Dean et al. (2012) run fetches and pushes in threads beside the compute; here they are Ray calls to every
shard that the loop starts and does not wait for: a fetch is started every ``fetch_every`` steps and its
parameters are taken up between two steps once every shard has answered (``ray.wait`` with no wait), and
the gradients accumulated over ``push_every`` steps are pushed without waiting (at most
``_MAX_INFLIGHT_PER_SHARD`` per shard in flight, so a slow shard pushes back on the learner). A shard that
is down (restarting) only costs the pushes sent to it meanwhile and keeps its old parameters in the replica.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

__all__ = ["DownpourLoop"]

_MAX_INFLIGHT_PER_SHARD = 2  # bounds memory and lets a slow shard push back on the learner


class DownpourLoop:
    """One learner's Downpour loop over ``shards`` (actor handles)."""

    def __init__(self, learner: Any, shards: list, fetch_every: int, push_every: int, timeout_s: float):
        self.learner, self.shards = learner, shards
        self.fetch_every, self.push_every, self.timeout_s = fetch_every, push_every, timeout_s
        self.pushed = self.pulled = self.push_errors = self.fetch_errors = self.steps = 0
        self.inflight: deque = deque()

    def _start_fetch(self) -> tuple[float, list[tuple[Any, Any]]]:
        return time.monotonic(), [tuple(s.get.options(num_returns=2).remote()) for s in self.shards]

    def _take(self, fetch: tuple[float, list[tuple[Any, Any]]], slices: list, versions: list[int],
              wait_s: float = 0.0) -> bool:
        """Take a fetch's parameters into ``slices`` once every shard answered; False while it is still out.

        A shard that failed, or that did not answer within ``timeout_s`` of the fetch, keeps its old parameters.
        """
        started, calls = fetch
        refs = [r for call in calls for r in call]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        if len(ready) < len(refs) and time.monotonic() - started < self.timeout_s:
            return False
        done = set(ready)
        for s, (meta_ref, params_ref) in enumerate(calls):
            if meta_ref not in done or params_ref not in done:
                self.fetch_errors += 1
                continue
            try:
                meta, params = ray.get([meta_ref, params_ref], timeout=self.timeout_s)
            except Exception:  # the shard is restarting or gone: keep the parameters we have
                self.fetch_errors += 1
                continue
            slices[s], versions[s] = params, int(meta["version"])
            self.pulled += params.nbytes
        return True

    def _first_fetch(self) -> tuple[list[np.ndarray | None], list[int]]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            slices: list[np.ndarray | None] = [None] * len(self.shards)
            versions = [0] * len(self.shards)
            self._take(self._start_fetch(), slices, versions, wait_s=self.timeout_s)
            if all(s is not None for s in slices):
                return slices, versions
            if time.monotonic() > deadline:
                raise TimeoutError(f"learner {self.learner.id}: shards did not answer within {self.timeout_s:.0f} s")
            time.sleep(0.1)

    def _push(self, grads: list[np.ndarray], versions: list[int]) -> None:
        for shard, g, v in zip(self.shards, grads, versions):
            self.inflight.append(shard.push.remote(g, v))
            self.pushed += g.nbytes
        while len(self.inflight) > _MAX_INFLIGHT_PER_SHARD * len(self.shards):
            self._settle(self.inflight.popleft())

    def _settle(self, ref: Any) -> None:
        try:
            ray.get(ref, timeout=self.timeout_s)
        except Exception:  # a push to a shard that died is lost, like the replica's share of data in Downpour
            self.push_errors += 1

    def run(self, stopping: Callable[[], bool], max_s: float) -> dict[str, Any]:
        """Loop until ``stopping()`` or ``max_s`` seconds; returns counters and the loss of every step."""
        t_end = time.monotonic() + max_s
        slices, versions = self._first_fetch()
        fetching = None
        acc: list[np.ndarray] | None = None
        acc_versions: list[int] = versions
        losses: list[float] = []
        while not stopping() and time.monotonic() < t_end:
            if fetching is not None and self._take(fetching, slices, versions):
                fetching = None
            if fetching is None and self.steps > 0 and self.steps % self.fetch_every == 0:
                fetching = self._start_fetch()
            loss, grads, _ = self.learner._step(slices)
            losses.append(loss)
            if acc is None:
                # Staleness is counted from the oldest parameters that went into the accumulated push.
                acc, acc_versions = [g.copy() for g in grads], list(versions)
            else:
                for a, g in zip(acc, grads):
                    a += g
            self.steps += 1
            if self.steps % self.push_every == 0:
                self._push(acc, acc_versions)
                acc = None
        while self.inflight:
            self._settle(self.inflight.popleft())
        return {"learner": self.learner.id, "steps": self.steps, "losses": losses, "bytes_pushed": self.pushed,
                "bytes_pulled": self.pulled, "push_errors": self.push_errors, "fetch_errors": self.fetch_errors}
