"""A learner: a model replica and a shard of the data that turns parameters into gradients (a Ray actor).

The actor is threaded (plain methods, ``max_concurrency`` > 1), not asynchronous: an asyncio actor costs
about 0.8-0.9 ms more CPU per call in Ray (measured in ``benchmarks/results/2026-11-23-ps-performance.md``), more than a small model's
whole mini-batch. The extra threads serve the small control calls while a mini-batch runs:
:meth:`interrupt` ends a mini-batch's injected delay at once (what the coordinator's cancel does;
``ray.cancel`` cannot interrupt a running task of a threaded actor), and :meth:`stop` ends Downpour's loop.
One mini-batch computes at a time (a lock); ``ps.threads`` bounds its intra-op threads.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any

import numpy as np

__all__ = ["Learner", "NotSetUp", "CONCURRENCY"]

CONCURRENCY = 4  # a mini-batch or Downpour's loop, plus interrupt/stop/pid calls beside it


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
        self.compute_lock = threading.Lock()
        self.wake = threading.Condition()
        self.interrupted: set[int] = set()
        self.ready, self.stopping = False, False

    def setup(self, spec: dict[str, Any], inputs: np.ndarray, targets: np.ndarray) -> dict[str, Any]:
        """Build the replica and the data stream of a run; returns pid and whether Ray restarted this actor."""
        from ..models import build_model
        from .data import channel_stats, resolve_loss
        from .delays import delay_rng, parse_delay
        from .replica import Replica
        from .sharding import Layout
        from .stream import BatchStream

        torch = self.torch
        with self.compute_lock:
            torch.manual_seed(spec["seed"])
            model = build_model(spec["model"], tuple(spec["in_shape"]), spec["num_classes"], spec["width"],
                                spec["depth"])
            device = torch.device("cuda" if spec.get("gpu") and torch.cuda.is_available() else "cpu")
            self.layout = Layout(tuple(map(tuple, spec["shapes"])), tuple(map(tuple, spec["shards"])))
            self.replica = Replica(model, self.layout, device)
            self.loss_fn = resolve_loss(spec["loss"])
            # Read-only views of the object store's arrays: every learner on a node shares one copy.
            self.inputs, self.targets = torch.from_numpy(inputs), torch.from_numpy(targets)
            self.mean, self.std = channel_stats(spec["mean"], spec["std"], self.inputs.dim())
            self.stream = BatchStream(len(self.targets), spec["rank"], spec["world"], spec["batch_size"],
                                      spec["seed"])
            self.delay = parse_delay(spec["delay"])
            self.rng = delay_rng(spec["seed"], self.id, int(self.reconstructed))
            with self.wake:
                self.interrupted.clear()
            self.ready, self.stopping = True, False
        return {"learner": self.id, "pid": os.getpid(), "reconstructed": self.reconstructed, "device": str(device)}

    # ------------------------------------------------------------------------------ one mini-batch

    def _gradient(self, slices: list[np.ndarray]) -> tuple[float, list[np.ndarray]]:
        from .data import normalise, targets

        t0 = time.perf_counter()
        self.replica.load(slices)
        self.last_load = time.perf_counter() - t0
        idx = self.torch.from_numpy(self.stream.next())
        x = normalise(self.inputs[idx], self.mean, self.std)
        return self.replica.gradient(x, targets(self.targets[idx]), self.loss_fn)

    def _step(self, slices: list[np.ndarray], ticket: int | None = None) -> tuple[float, list[np.ndarray], float]:
        """One mini-batch, then its injected delay (ended early by :meth:`interrupt` of ``ticket`` or :meth:`stop`)."""
        if not self.ready:
            raise NotSetUp(f"learner {self.id} was restarted and has no model yet")
        t0 = time.perf_counter()
        with self.compute_lock:
            loss, grads = self._gradient(slices)
        compute_s = time.perf_counter() - t0
        delay = self.delay.sample(self.rng, self.id, compute_s)
        if delay > 0:
            with self.wake:
                self.wake.wait_for(lambda: self.stopping or ticket in self.interrupted, timeout=delay)
        self.last_delay = delay
        return loss, grads, compute_s

    def compute(self, version: int, ticket: int, *slices: np.ndarray) -> tuple:
        """Gradient on the next mini-batch at these parameters; call with ``num_returns = shards + 1``.

        Returns (meta, grad slice per shard); meta has the loss, the bytes moved and when the call started
        and ended (``time.perf_counter``, one clock for every process of a node) for the time breakdown.
        Work interrupted before it started returns at once with ``meta["interrupted"]`` and empty slices.
        """
        t_start = time.perf_counter()
        with self.wake:
            skip = ticket in self.interrupted
            self.interrupted.discard(ticket) if skip else None
        if skip:
            empty = np.zeros(0, np.float32)
            return ({"learner": self.id, "ticket": ticket, "interrupted": True}, *[empty] * len(slices))
        loss, grads, compute_s = self._step(list(slices), ticket)
        with self.wake:
            self.interrupted.discard(ticket)
        meta = {"learner": self.id, "version": version, "ticket": ticket, "loss": loss, "compute_s": compute_s,
                "delay_s": self.last_delay, "load_s": self.last_load, "t_start": t_start, "t_end": time.perf_counter(),
                "pulled": int(sum(s.nbytes for s in slices)), "pushed": int(sum(g.nbytes for g in grads))}
        return (meta, *grads)

    def interrupt(self, ticket: int) -> bool:
        """Abandon mini-batch ``ticket``: end its injected delay now, or skip it if it has not started."""
        with self.wake:
            self.interrupted.add(ticket)
            self.wake.notify_all()
        return True

    # ------------------------------------------------------------------------------ Downpour

    def run_downpour(self, shards: list, fetch_every: int, push_every: int, max_s: float,
                     timeout_s: float) -> dict[str, Any]:
        """Downpour's replica loop: fetch and push on its own, every N steps, until :meth:`stop` or ``max_s``."""
        from .downpour_loop import DownpourLoop

        if not self.ready:
            raise NotSetUp(f"learner {self.id} was restarted and has no model yet")
        loop = DownpourLoop(self, shards, fetch_every, push_every, timeout_s)
        return loop.run(lambda: self.stopping, max_s)

    def stop(self) -> bool:
        """Ask the Downpour loop to finish its step and return (also if it has not started yet; setup clears it)."""
        with self.wake:
            self.stopping = True
            self.wake.notify_all()
        return True

    def pid(self) -> int:
        """Process id (tests kill it)."""
        return os.getpid()
