"""A learner's shard of the training set as an endless, seeded stream of mini-batch indices."""

from __future__ import annotations

import numpy as np

__all__ = ["BatchStream"]


class BatchStream:
    """Learner ``rank`` of ``world`` sees samples ``rank::world``, reshuffled every epoch, full batches only.

    The same (n, rank, world, batch, seed) always gives the same batches, so a test can rebuild what
    every learner trained on.
    """

    def __init__(self, n: int, rank: int, world: int, batch: int, seed: int):
        self.own = np.arange(rank, n, world)
        self.batch = min(batch, len(self.own))
        self.rank, self.seed, self.epoch, self.pos = rank, seed, 0, 0
        self.order = self._shuffle()

    def _shuffle(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.rank, self.epoch])
        return self.own[rng.permutation(len(self.own))]

    def next(self) -> np.ndarray:
        """Indices of the next mini-batch."""
        if self.pos + self.batch > len(self.order):
            self.epoch, self.pos = self.epoch + 1, 0
            self.order = self._shuffle()
        idx = self.order[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return idx
