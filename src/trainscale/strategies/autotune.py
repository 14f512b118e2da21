"""Bucket autotuning (``strategy.bucket_mb = auto``): time a few bucket sizes on the real job, keep the fastest.

Horovod tunes its fusion buffer this way; DDP fixes its buckets at construction, so each candidate
re-wraps the module in a new DDP. The trial steps are real training steps (same samples, same
updates): only the bucket layout changes between them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..log import logger
from .ddp import grad_buckets

__all__ = ["BucketTuner", "distinct_candidates"]

WARM_STEPS = 2  # a new DDP rebuilds its buckets after its first step; time from the third


def distinct_candidates(params: list[nn.Parameter], sizes_mb: list[float]) -> list[float]:
    """Drop sizes that give the same bucket layout as a smaller one (a small model has few distinct layouts)."""
    seen, out = set(), []
    for mb in sorted(sizes_mb):
        layout = tuple(len(b) for b in grad_buckets(params, mb))
        if layout not in seen:
            seen.add(layout)
            out.append(mb)
    return out


class BucketTuner:
    """Steps through the candidates: ``WARM_STEPS`` untimed, then ``measure`` timed steps each; picks the fastest."""

    __slots__ = ("candidates", "measure", "rewrap", "device", "index", "count", "t0", "tried", "chosen")

    def __init__(self, candidates: list[float], measure: int, rewrap: Callable[[float], None], device: torch.device,
                 why_one: str | None = None):
        """``why_one``: the line logged when a single candidate is given for a reason of the caller's."""
        self.candidates, self.measure, self.rewrap, self.device = candidates, measure, rewrap, device
        self.index, self.count, self.t0 = 0, 0, 0.0
        self.tried: dict[float, float] = {}
        self.chosen: float | None = candidates[0] if len(candidates) == 1 else None
        if self.chosen is not None:
            logger.info(why_one or f"bucket autotune: every candidate gives one layout; using {self.chosen:g} MB")

    @property
    def active(self) -> bool:
        """True while candidates are still being timed."""
        return self.chosen is None

    @property
    def current(self) -> float:
        """The bucket size in use now."""
        return self.chosen if self.chosen is not None else self.candidates[self.index]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def after_step(self) -> None:
        """Called after every optimizer step while ``active``; may re-wrap the model for the next candidate."""
        self.count += 1
        if self.count == WARM_STEPS:
            self._sync()
            self.t0 = time.perf_counter()
        elif self.count == WARM_STEPS + self.measure:
            self._sync()
            t = torch.tensor([(time.perf_counter() - self.t0) / self.measure], device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace; all ranks agree
            self.tried[self.candidates[self.index]] = t.item()
            self.index, self.count = self.index + 1, 0
            if self.index < len(self.candidates):
                self.rewrap(self.candidates[self.index])
            else:
                self._choose()

    def _choose(self) -> None:
        self.chosen = min(self.tried, key=self.tried.__getitem__) if self.tried else self.candidates[0]
        tried = ", ".join(f"{mb:g} MB {t * 1e3:.2f} ms" for mb, t in self.tried.items())
        logger.info(f"bucket autotune: tried {tried or 'nothing (too few steps)'}; chose {self.chosen:g} MB")
        if self.chosen != self.candidates[min(self.index, len(self.candidates) - 1)]:
            self.rewrap(self.chosen)

    def finish(self) -> None:
        """End of the run before every candidate was timed: choose among those that were, without re-wrapping."""
        if self.chosen is None:
            self.chosen = min(self.tried, key=self.tried.__getitem__) if self.tried else self.current
            logger.info(f"bucket autotune: the run ended while tuning; best so far {self.chosen:g} MB")

    def report(self) -> dict[str, Any]:
        """Summary entry: step time (s) of each size tried, and the choice."""
        return {"tried": {f"{mb:g}": t for mb, t in self.tried.items()}, "chosen_mb": self.chosen}
