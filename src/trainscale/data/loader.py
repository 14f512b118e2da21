"""Loaders: samples stay uint8 until they reach the device, where they are normalised."""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from .datasets import DataInfo
from .sampler import ShardedSampler, eval_indices

__all__ = ["DeviceNormalize", "TrainLoader", "eval_batches"]



def _collate(batch: object) -> object:
    if isinstance(batch, tuple) and len(batch) == 2 and torch.is_tensor(batch[0]):
        return batch
    return torch.utils.data.default_collate(batch)


class DeviceNormalize:
    """Move a batch to the device, then cast and normalise there (uint8 travels, 4x less than float32)."""

    def __init__(self, info: DataInfo, device: torch.device):
        c = len(info.mean)
        self.device = device
        self.mean = torch.tensor(info.mean, device=device).view(1, c, 1, 1)
        self.std = torch.tensor(info.std, device=device).view(1, c, 1, 1)

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        nb = self.device.type == "cuda"
        x, y = x.to(self.device, non_blocking=nb), y.to(self.device, non_blocking=nb)
        if x.dtype == torch.uint8:
            x = (x.float() - self.mean) / self.std
        return x, y


class TrainLoader:
    """Endless device batches over epochs, with a position that checkpoints can save and restore."""

    def __init__(self, dataset: Dataset, info: DataInfo, device: torch.device, batch_size: int,
                 rank: int = 0, world: int = 1, workers: int = 0, shuffle: bool = True, seed: int = 0):
        self.dataset, self.batch_size, self.workers = dataset, batch_size, workers
        self.sampler = ShardedSampler(len(dataset), rank, world, shuffle, seed)
        self.to_device = DeviceNormalize(info, device)
        self.pin = device.type == "cuda"
        self.epoch, self.batch_in_epoch = 0, 0
        self._it: Iterator | None = None

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.sampler.per_rank // self.batch_size)

    def _start_epoch(self) -> None:
        self.sampler.set_epoch(self.epoch, self.batch_in_epoch * self.batch_size)
        loader = DataLoader(self.dataset, batch_size=self.batch_size, sampler=self.sampler, num_workers=self.workers,
                            pin_memory=self.pin, collate_fn=_collate, persistent_workers=False)
        self._it = iter(loader)

    def __iter__(self) -> "TrainLoader":
        return self

    def next_host(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch as the loader produced it (still on the host, still uint8)."""
        if self._it is None:
            self._start_epoch()
        try:
            batch = next(self._it)  # type: ignore[arg-type]
        except StopIteration:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self._start_epoch()
            batch = next(self._it)  # type: ignore[arg-type]
        self.batch_in_epoch += 1
        return batch

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.to_device(self.next_host())

    def state_dict(self) -> dict[str, int]:
        """Where the next batch comes from: epoch and batches already taken in it."""
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        self._it = None


def eval_batches(dataset: Dataset, info: DataInfo, device: torch.device, batch_size: int, rank: int, world: int,
                 ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's evaluation batches, on the device; shards are uneven, no sample is repeated."""
    idx = eval_indices(len(dataset), rank, world)
    to_device = DeviceNormalize(info, device)
    for i in range(0, len(idx), batch_size):
        yield to_device(_collate(dataset.__getitems__(idx[i:i + batch_size]) if hasattr(dataset, "__getitems__")
                                 else [dataset[j] for j in idx[i:i + batch_size]]))
