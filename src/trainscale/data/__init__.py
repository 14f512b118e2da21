"""Datasets, sharded samplers and loaders that keep samples uint8 until the device."""

from .datasets import DataInfo, TensorImages, available_datasets, build_datasets, register_dataset
from .loader import DeviceNormalize, TrainLoader, eval_batches
from .sampler import ShardedSampler, eval_indices

__all__ = ["DataInfo", "TensorImages", "available_datasets", "build_datasets", "register_dataset",
           "DeviceNormalize", "TrainLoader", "eval_batches", "ShardedSampler", "eval_indices"]
