"""Optional NVIDIA DALI backend (``data.backend = dali``): decode, crop and normalise an image folder on the GPU.

Needs CUDA and ``nvidia-dali`` (e.g. ``pip install nvidia-dali-cuda120``); nothing else in trainscale
imports it. JPEGs are decoded by nvJPEG ("mixed" device), so only compressed bytes cross PCIe.
Limits: image folders only; a resumed run restarts the reader at its epoch's beginning (DALI's
reader has no position to restore here), which the loader says when it happens.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..config import ConfigError, DataConfig
from ..log import logger
from .datasets import DataInfo

__all__ = ["DaliLoader", "check_dali"]


def check_dali(cfg: DataConfig) -> None:
    """Refuse ``data.backend = dali`` where it cannot run, saying why."""
    if cfg.name != "imagefolder":
        raise ConfigError("data.backend", "dali", f"works with data.name = imagefolder, not {cfg.name}")
    if not torch.cuda.is_available():
        raise ConfigError("data.backend", "dali", "needs a CUDA device; use data.backend = torch here")
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        raise ConfigError("data.backend", "dali", "needs nvidia-dali (pip install nvidia-dali-cuda120)") from None


class DaliLoader:
    """Endless normalised GPU batches from a DALI pipeline, with the ``TrainLoader`` interface."""

    def __init__(self, cfg: DataConfig, info: DataInfo, device: torch.device, rank: int, world: int, seed: int):
        check_dali(cfg)
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        size = cfg.image_size

        @pipeline_def
        def pipe() -> Any:
            jpegs, labels = fn.readers.file(file_root=cfg.path, shard_id=rank, num_shards=world,
                                            random_shuffle=cfg.shuffle, seed=seed, pad_last_batch=True,
                                            name="reader")
            images = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB)
            images = fn.resize(images, resize_x=size, resize_y=size)
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              mean=list(info.mean), std=list(info.std),
                                              mirror=fn.random.coin_flip())
            return images, labels.gpu()

        p = pipe(batch_size=cfg.batch_size, num_threads=max(cfg.workers, 2), device_id=device.index or 0,
                 seed=seed + rank, prefetch_queue_depth=max(cfg.prefetch, 1))
        p.build()
        self._it = DALIGenericIterator([p], ["x", "y"], reader_name="reader", auto_reset=True,
                                       last_batch_policy=LastBatchPolicy.PARTIAL)
        self.batches_per_epoch = len(self._it)
        self.epoch, self.batch_in_epoch, self.skipped, self.workers_started = 0, 0, 0, 0
        self._busy_s, self._samples = 0.0, 0

    def __iter__(self) -> DaliLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        try:
            out = next(self._it)
        except StopIteration:  # auto_reset has rewound the reader: the next epoch begins
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            out = next(self._it)
        x, y = out[0]["x"], out[0]["y"].squeeze(-1).long()
        self.batch_in_epoch += 1
        self._busy_s += time.perf_counter() - t0
        self._samples += len(y)
        return x, y

    next_host = __next__

    @property
    def samples_per_s(self) -> float:
        """Samples per second of waiting on DALI (its work runs asynchronously, so an upper bound)."""
        return self._samples / self._busy_s if self._busy_s else float("nan")

    def state_dict(self) -> dict[str, int]:
        """Epoch and batches consumed in it."""
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        if int(state["batch_in_epoch"]):
            logger.warning("data.backend = dali resumes at the beginning of the epoch, not mid-epoch")

    def close(self) -> None:
        """Nothing to stop: DALI's threads end with the pipeline."""
