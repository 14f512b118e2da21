"""Split a model's parameter tensors across server shards, balanced by size, and move flat slices.

Whole tensors go to shards (largest first onto the least loaded shard), so a shard's slice is the
concatenation of its tensors in model order, and learners pack their gradients the same way.

Example::

    layout = balance([(256, 64), (256,), (10, 256), (10,)], shards=2)
    layout.shards      # ((0,), (1, 2, 3)) : 16384 and 2826 elements
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config import ConfigError

__all__ = ["Layout", "balance"]


@dataclass(frozen=True)
class Layout:
    """Which tensors (by index in model order) each shard owns, and every tensor's shape."""

    shapes: tuple[tuple[int, ...], ...]
    shards: tuple[tuple[int, ...], ...]

    def sizes(self) -> list[int]:
        """Elements per shard."""
        return [sum(math.prod(self.shapes[t]) for t in ts) for ts in self.shards]

    @property
    def numel(self) -> int:
        """Elements of the whole model."""
        return sum(self.sizes())

    def split(self, tensors: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One flat float32 slice per shard from the model's tensors (in model order)."""
        return [np.concatenate([np.asarray(tensors[t], dtype=np.float32).reshape(-1) for t in ts])
                for ts in self.shards]

    def join(self, slices: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The model's tensors (in model order) from one flat slice per shard."""
        out: list[np.ndarray | None] = [None] * len(self.shapes)
        for ts, flat in zip(self.shards, slices):
            offset = 0
            for t in ts:
                n = math.prod(self.shapes[t])
                out[t] = np.asarray(flat[offset:offset + n]).reshape(self.shapes[t])
                offset += n
        return out  # type: ignore[return-value]


def balance(shapes: Sequence[Sequence[int]], shards: int) -> Layout:
    """Greedy largest-first partition of tensors onto ``shards`` shards; every shard gets a tensor."""
    dims = tuple(tuple(int(d) for d in s) for s in shapes)
    if shards > len(dims):
        raise ConfigError("ps.shards", shards, f"at most the model's {len(dims)} parameter tensors")
    load = [0] * shards
    owned: list[list[int]] = [[] for _ in range(shards)]
    order = sorted(range(len(dims)), key=lambda t: (-math.prod(dims[t]), t))
    for i, t in enumerate(order):
        # The first `shards` tensors seed one shard each so none is left empty.
        s = i if i < shards else min(range(shards), key=lambda j: (load[j], j))
        owned[s].append(t)
        load[s] += math.prod(dims[t])
    return Layout(dims, tuple(tuple(sorted(o)) for o in owned))
