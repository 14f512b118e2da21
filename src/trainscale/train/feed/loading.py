"""The run's training loader from what a user hands over: a Dataset, a DataLoader, or a ready loader."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, SequentialSampler, default_collate

from ...config import Config, apply_overrides
from ...data import DataInfo, build_train_loader
from ...data.delay import with_sample_delay
from ...data.loader import TrainLoader
from ..errors import RunError

__all__ = ["is_ready_loader", "make_loader"]


def is_ready_loader(data: Any) -> bool:
    """trainscale's loader, or one with its interface (iterator with a state): used as it is."""
    return isinstance(data, TrainLoader) or hasattr(data, "state_dict") and hasattr(data, "__next__")


def make_loader(cfg: Config, data: Any, info: DataInfo | None, device: torch.device, shard: tuple[int, int],
                is_main: bool) -> TrainLoader:
    """This rank's shard of ``data``, prefetched to ``device``.

    A DataLoader's batch size, workers, collate_fn and shuffling are kept (its sampler is replaced by one that
    shards across ranks; ``data.workers`` applies when it has none); a Dataset gets the ``data`` section's. ``info``: built-in image data, decoded by the
    configured loader (DALI too) and normalised on the device.
    """
    d = cfg.data
    kw: dict[str, Any] = {"batch_size": d.batch_size, "workers": d.workers, "collate": None, "shuffle": d.shuffle}
    if isinstance(data, DataLoader):
        collate = None if data.collate_fn is default_collate else data.collate_fn
        # data.workers can raise a DataLoader's worker count (the doctor's advice for a slow collate, and --apply).
        kw = {"batch_size": data.batch_size or d.batch_size, "workers": data.num_workers or d.workers, "collate": collate,
              "shuffle": not isinstance(data.sampler, SequentialSampler)}
        data = data.dataset
    if not isinstance(data, Dataset) and not hasattr(data, "__getitem__"):
        raise RunError(f"run.prepare/batches: data must be a Dataset, a DataLoader, a function returning a batch or "
                       f"an iterable of batches, not {type(data).__name__}")
    data = with_sample_delay(data, d.sample_delay_ms, d.sample_delay_scope)  # the slow-disk experiment
    if info is not None:
        dcfg = apply_overrides(cfg, {"data.batch_size": kw["batch_size"]}).data
        return build_train_loader(dcfg, data, info, device, *shard, cfg.job.seed, is_main)
    return TrainLoader(data, None, device, kw["batch_size"], *shard, kw["workers"], kw["shuffle"], cfg.job.seed,
                       prefetch=d.prefetch, on_error=d.on_error, collate=kw["collate"])
