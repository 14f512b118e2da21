"""A learner: a model replica and a shard of the data that turns parameters into gradients (a Ray actor).

The actor is asynchronous (its methods are coroutines) so that ``ray.cancel`` interrupts a mini-batch
that waits on its injected delay, and so that Downpour's fetches and pushes run beside the compute.
The gradient itself is computed on one worker thread, with ``ps.threads`` intra-op threads.
"""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["Learner", "NotSetUp"]


class NotSetUp(RuntimeError):
    """The learner has no model yet: it was restarted by Ray and must be set up again."""


class Learner:
    """Learner ``learner_id``; :meth:`setup` gives it a model, data and a delay for one run."""

    def __init__(self, learner_id: int, threads: int = 1):
        import ray
        import torch

        torch.set_num_threads(max(1, threads))
        self.id, self.torch = learner_id, torch
        with warnings.catch_warnings():  # Ray's property warns about an internal call of its own
            warnings.simplefilter("ignore")
            self.reconstructed = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"learner{learner_id}")
        self.ready, self.stopping = False, False

    async def setup(self, spec: dict[str, Any], images: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
        """Build the replica and the data stream of a run; returns pid and whether Ray restarted this actor."""
        from ..models import build_model
        from .delays import delay_rng, parse_delay
        from .sharding import Layout
        from .stream import BatchStream

        torch = self.torch
        torch.manual_seed(spec["seed"])
        self.model = build_model(spec["model"], tuple(spec["in_shape"]), spec["num_classes"], spec["width"],
                                 spec["depth"])
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.layout = Layout(tuple(map(tuple, spec["shapes"])), tuple(map(tuple, spec["shards"])))
        self.images = torch.from_numpy(np.array(images))
        self.labels = torch.from_numpy(np.array(labels)).long()
        c = len(spec["mean"])
        self.mean = torch.tensor(spec["mean"]).view(1, c, 1, 1)
        self.std = torch.tensor(spec["std"]).view(1, c, 1, 1)
        self.stream = BatchStream(len(self.labels), spec["rank"], spec["world"], spec["batch_size"], spec["seed"])
        self.delay = parse_delay(spec["delay"])
        self.rng = delay_rng(spec["seed"], self.id, int(self.reconstructed))
        self.ready, self.stopping = True, False
        return {"learner": self.id, "pid": os.getpid(), "reconstructed": self.reconstructed}

    # ------------------------------------------------------------------------------ one mini-batch

    def _gradient(self, slices: list[np.ndarray]) -> tuple[float, list[np.ndarray]]:
        torch = self.torch
        with torch.no_grad():
            for p, w in zip(self.params, self.layout.join(slices)):
                p.copy_(torch.from_numpy(np.array(w, dtype=np.float32)))
        idx = torch.from_numpy(self.stream.next())
        x = (self.images[idx].float() - self.mean) / self.std
        self.model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(self.model(x), self.labels[idx])
        loss.backward()
        grads = [p.grad.detach().numpy() for p in self.params]
        return loss.item(), self.layout.split(grads)

    async def _step(self, slices: list[np.ndarray]) -> tuple[float, list[np.ndarray], float]:
        if not self.ready:
            raise NotSetUp(f"learner {self.id} was restarted and has no model yet")
        t0 = time.perf_counter()
        loss, grads = await asyncio.get_running_loop().run_in_executor(self.executor, self._gradient, slices)
        compute_s = time.perf_counter() - t0
        delay = self.delay.sample(self.rng, self.id, compute_s)
        if delay > 0:
            await asyncio.sleep(delay)  # where ray.cancel lands: the straggler's wait is abandoned at once
        return loss, grads, compute_s

    async def compute(self, version: int, ticket: int, *slices: np.ndarray) -> tuple:
        """Gradient on the next mini-batch at these parameters; call with ``num_returns = shards + 1``.

        Returns (meta, grad slice per shard); meta has the loss and the bytes moved.
        """
        loss, grads, compute_s = await self._step(list(slices))
        meta = {"learner": self.id, "version": version, "ticket": ticket, "loss": loss, "compute_s": compute_s,
                "pulled": int(sum(s.nbytes for s in slices)), "pushed": int(sum(g.nbytes for g in grads))}
        return (meta, *grads)

    # ------------------------------------------------------------------------------ Downpour

    async def run_downpour(self, shards: list, fetch_every: int, push_every: int, max_s: float,
                           timeout_s: float) -> dict[str, Any]:
        """Downpour's replica loop: fetch and push on its own, every N steps, until :meth:`stop` or ``max_s``."""
        from .downpour_loop import DownpourLoop

        if not self.ready:
            raise NotSetUp(f"learner {self.id} was restarted and has no model yet")
        loop = DownpourLoop(self, shards, fetch_every, push_every, timeout_s)
        return await loop.run(lambda: self.stopping, max_s)

    async def stop(self) -> bool:
        """Ask the Downpour loop to finish its step and return (also if it has not started yet; setup clears it)."""
        self.stopping = True
        return True

    async def pid(self) -> int:
        """Process id (tests kill it)."""
        return os.getpid()
