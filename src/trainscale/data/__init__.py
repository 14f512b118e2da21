"""Datasets, sharded samplers and loaders that keep samples uint8 until the device."""

from .build import build_train_loader, check_data
from .checks import data_wait_advice, startup_warnings
from .datasets import (
    DataInfo,
    TensorImages,
    available_datasets,
    build_datasets,
    infer_info,
    load_digits_arrays,
    register_dataset,
)
from .loader import DeviceNormalize, Prefetcher, TrainLoader, eval_batches
from .sampler import EpochBatchSampler, ShardedSampler, eval_indices

__all__ = ["DataInfo", "infer_info", "TensorImages", "available_datasets", "build_datasets", "register_dataset",
           "DeviceNormalize", "Prefetcher", "TrainLoader", "eval_batches", "ShardedSampler", "EpochBatchSampler",
           "eval_indices", "build_train_loader", "check_data", "data_wait_advice", "startup_warnings", "load_digits_arrays"]
