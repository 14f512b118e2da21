"""Inside a Downpour learner: compute on the last parameters fetched, while fetches and pushes fly beside it.

Dean et al. (2012) run fetches and pushes in threads beside the compute; here they are asyncio tasks of
the learner's event loop waiting on Ray calls to every shard, which gives the same overlap: a fetch is
started every ``fetch_every`` steps and its parameters are taken up as soon as they arrive, pushes of the
gradients accumulated over ``push_every`` steps are sent without waiting. A shard that is down (restarting)
only costs the pushes sent to it meanwhile and keeps its old parameters in the replica.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Callable

import numpy as np

__all__ = ["DownpourLoop"]

_MAX_INFLIGHT_PER_SHARD = 2  # bounds memory and lets a slow shard push back on the learner


class DownpourLoop:
    """One learner's Downpour loop over ``shards`` (actor handles)."""

    def __init__(self, learner: Any, shards: list, fetch_every: int, push_every: int, timeout_s: float):
        self.learner, self.shards = learner, shards
        self.fetch_every, self.push_every, self.timeout_s = fetch_every, push_every, timeout_s
        self.pushed = self.pulled = self.push_errors = self.fetch_errors = self.steps = 0
        self.inflight: deque = deque()

    async def _fetch(self) -> list[tuple[np.ndarray, int] | None]:
        """(parameters, version) from every shard; None for a shard that did not answer."""

        async def one(shard: Any) -> tuple[np.ndarray, int] | None:
            meta_ref, params_ref = shard.get.options(num_returns=2).remote()
            try:
                meta = await asyncio.wait_for(meta_ref, self.timeout_s)
                params = await asyncio.wait_for(params_ref, self.timeout_s)
            except Exception:  # the shard is restarting or gone: keep the parameters we have
                self.fetch_errors += 1
                return None
            self.pulled += params.nbytes
            return params, int(meta["version"])

        return list(await asyncio.gather(*(one(s) for s in self.shards)))

    async def _first_fetch(self) -> tuple[list[np.ndarray], list[int]]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            got = await self._fetch()
            if all(g is not None for g in got):
                return [g[0] for g in got], [g[1] for g in got]  # type: ignore[index]
            if time.monotonic() > deadline:
                raise TimeoutError(f"learner {self.learner.id}: shards did not answer within {self.timeout_s:.0f} s")
            await asyncio.sleep(0.1)

    async def _push(self, grads: list[np.ndarray], versions: list[int]) -> None:
        for shard, g, v in zip(self.shards, grads, versions):
            self.inflight.append(shard.push.remote(g, v))
            self.pushed += g.nbytes
        while len(self.inflight) > _MAX_INFLIGHT_PER_SHARD * len(self.shards):
            await self._settle(self.inflight.popleft())

    async def _settle(self, ref: Any) -> None:
        try:
            await asyncio.wait_for(ref, self.timeout_s)
        except Exception:  # a push to a shard that died is lost, like the replica's share of data in Downpour
            self.push_errors += 1

    async def run(self, stopping: Callable[[], bool], max_s: float) -> dict[str, Any]:
        """Loop until ``stopping()`` or ``max_s`` seconds; returns counters and the loss of every step."""
        t_end = time.monotonic() + max_s
        slices, versions = await self._first_fetch()
        fetching: asyncio.Future | None = None
        acc: list[np.ndarray] | None = None
        acc_versions: list[int] = versions
        losses: list[float] = []
        while not stopping() and time.monotonic() < t_end:
            if fetching is not None and fetching.done():
                for s, got in enumerate(fetching.result()):
                    if got is not None:
                        slices[s], versions[s] = got
                fetching = None
            if fetching is None and self.steps > 0 and self.steps % self.fetch_every == 0:
                fetching = asyncio.ensure_future(self._fetch())
            loss, grads, _ = await self.learner._step(slices)
            losses.append(loss)
            if acc is None:
                # Staleness is counted from the oldest parameters that went into the accumulated push.
                acc, acc_versions = [g.copy() for g in grads], list(versions)
            else:
                for a, g in zip(acc, grads):
                    a += g
            self.steps += 1
            if self.steps % self.push_every == 0:
                await self._push(acc, acc_versions)
                acc = None
        if fetching is not None:
            fetching.cancel()
            await asyncio.gather(fetching, return_exceptions=True)  # collect it, so nothing is left unretrieved
        while self.inflight:
            await self._settle(self.inflight.popleft())
        return {"learner": self.learner.id, "steps": self.steps, "losses": losses, "bytes_pushed": self.pushed,
                "bytes_pulled": self.pulled, "push_errors": self.push_errors, "fetch_errors": self.fetch_errors}
