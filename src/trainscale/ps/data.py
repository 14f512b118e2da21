"""The training data of a parameter-server job as two arrays, and the loss its learners minimise.

The job's datasets come from :func:`trainscale.data.build_datasets` (a registered name or a user's
``package.module:function``), exactly as ``trainscale train`` gets them. The driver turns the training
set into one array of inputs and one of targets, put once into Ray's object store and read by every
learner (shared memory on a node, no copy per learner process). Inputs stay in their own dtype; uint8
images are normalised on the learner with the dataset's mean and std, as the trainer's loader does.

The loss is ``job.loss`` when the configuration has that field (a ``package.module:function`` name or
``cross_entropy``), else cross-entropy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config import Config, ConfigError

__all__ = ["TrainArrays", "as_arrays", "infer_info", "loss_name", "resolve_loss", "normalise", "channel_stats", "targets"]

DEFAULT_LOSS = "cross_entropy"


@dataclass
class TrainArrays:
    """Inputs ``x`` (N, ...) and targets ``y`` (N, ...) of a dataset, as numpy arrays."""

    x: np.ndarray
    y: np.ndarray


def as_arrays(ds: Any, what: str = "data.name") -> TrainArrays:
    """A dataset as two arrays: tensors kept as they are (TensorImages, TensorDataset), else stacked samples."""
    if torch.is_tensor(getattr(ds, "images", None)) and torch.is_tensor(getattr(ds, "labels", None)):
        return TrainArrays(ds.images.numpy(), ds.labels.numpy())
    tensors = getattr(ds, "tensors", None)
    if isinstance(tensors, tuple) and len(tensors) >= 2 and all(torch.is_tensor(t) for t in tensors[:2]):
        return TrainArrays(tensors[0].numpy(), tensors[1].numpy())
    if len(ds) == 0:
        return TrainArrays(np.zeros((0,), np.float32), np.zeros((0,), np.int64))
    try:
        xs, ys = zip(*(ds[i] for i in range(len(ds))))
        return TrainArrays(torch.stack([torch.as_tensor(v) for v in xs]).numpy(),
                           torch.stack([torch.as_tensor(v) for v in ys]).numpy())
    except (TypeError, ValueError, RuntimeError) as e:
        raise ConfigError(what, type(ds).__name__, "samples must be (input, target) pairs of equal-shaped "
                          f"tensors for the parameter server ({e})") from None


def infer_info(arrays: TrainArrays) -> Any:
    """A DataInfo for a builder that returned none (the same rule as ``trainscale train``'s)."""
    from ..data import infer_info as infer

    return infer(tuple(arrays.x.shape[1:]), torch.from_numpy(np.ascontiguousarray(arrays.y)))


def loss_name(cfg: Config) -> str:
    """The loss the job names: ``job.loss`` if the configuration has it, else cross-entropy."""
    return str(getattr(cfg.job, "loss", "") or DEFAULT_LOSS)


def resolve_loss(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss ``job.loss`` names (one table for trainscale train and the parameter server)."""
    from ..models.losses import resolve_loss as resolve
    return resolve(name)


def normalise(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 images to float normalised by channel (as the trainer's loader does); other inputs as float."""
    if x.dtype == torch.uint8:
        return (x.float() - mean) / std
    return x if x.is_floating_point() else x.float()


def channel_stats(mean: Any, std: Any, ndim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std shaped to broadcast over a batch of ``ndim`` dimensions (channels second)."""
    c = len(mean)
    shape = (1, c) + (1,) * max(0, ndim - 2) if ndim >= 2 else (c,)
    return torch.tensor(mean).view(shape), torch.tensor(std).view(shape)


def targets(y: torch.Tensor) -> torch.Tensor:
    """Integer targets as int64 (what cross-entropy takes); others unchanged."""
    return y.long() if not y.is_floating_point() else y
