"""Sharded, resumable sampling: every rank a disjoint slice of one permutation per epoch."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch.utils.data import Sampler

__all__ = ["ShardedSampler", "eval_indices", "EpochBatchSampler", "BatchKey"]


class ShardedSampler(Sampler[int]):
    """Rank ``r`` of ``P`` takes positions ``r, r+P, r+2P, ...`` of the epoch's permutation.

    The permutation depends only on ``seed`` and the epoch, not on the world size, so a run on P
    processes with batch B visits the same samples per step as one process with batch P*B.
    When ``len(dataset)`` does not divide by P, the permutation is padded by repeating its first
    samples so all ranks take the same number of steps (the padded samples are seen twice in that
    epoch; every other sample exactly once across ranks). ``start`` skips that many of this rank's
    samples in the current epoch, for resuming mid-epoch.
    """

    def __init__(self, n: int, rank: int = 0, world: int = 1, shuffle: bool = True, seed: int = 0):
        if n < 1:
            raise ValueError("cannot sample from an empty dataset")
        self.n, self.rank, self.world, self.shuffle, self.seed = n, rank, world, shuffle, seed
        self.epoch, self.start = 0, 0
        self.per_rank = math.ceil(n / world)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Choose the epoch's permutation and where in this rank's shard to begin."""
        self.epoch, self.start = epoch, start

    def shard(self) -> torch.Tensor:
        """This rank's indices for the current epoch (padding included, ``start`` not applied)."""
        if self.shuffle:
            perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            perm = torch.arange(self.n)
        total = self.per_rank * self.world
        if total > self.n:
            perm = torch.cat([perm, perm[: total - self.n].repeat(math.ceil((total - self.n) / self.n))[: total - self.n]])
        return perm[self.rank:total:self.world]

    def __iter__(self) -> Iterator[int]:
        return iter(self.shard()[self.start:].tolist())

    def __len__(self) -> int:
        return self.per_rank - self.start


def eval_indices(n: int, rank: int, world: int) -> list[int]:
    """Evaluation shard: rank r takes r, r+P, ... with no padding, so no sample is counted twice."""
    return list(range(rank, n, world))


class BatchKey(NamedTuple):
    """What one batch is: its epoch, its number within the epoch, and the sample indices."""

    epoch: int
    batch: int
    indices: list[int]


class EpochBatchSampler:
    """This rank's batches of every epoch, one epoch after the other, forever.

    One DataLoader iterates this for the whole run, so its workers start once and keep producing
    across epoch boundaries (no respawn, no refilling of the prefetch queue each epoch: PaddlePaddle's infinite reader's
    "infinite reader"). Each batch carries its epoch, so workers can draw per-epoch augmentation.
    The last batch of an epoch is short when this rank's shard does not divide by the batch size.
    """

    def __init__(self, sampler: ShardedSampler, batch_size: int, epoch: int = 0, batch: int = 0):
        self.sampler, self.batch_size, self.epoch, self.batch = sampler, batch_size, epoch, batch

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.sampler.per_rank // self.batch_size)

    def __iter__(self) -> Iterator[BatchKey]:
        epoch, start, b = self.epoch, self.batch, self.batch_size
        while True:
            self.sampler.set_epoch(epoch)
            shard = self.sampler.shard()
            for k in range(start, self.batches_per_epoch):
                yield BatchKey(epoch, k, shard[k * b:(k + 1) * b].tolist())
            epoch, start = epoch + 1, 0
