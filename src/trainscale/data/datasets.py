"""Built-in datasets: uint8 images in memory as one tensor (no Python objects per sample)."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import ConfigError, DataConfig

__all__ = ["TensorImages", "DataInfo", "register_dataset", "build_datasets", "available_datasets"]


class TensorImages(Dataset):
    """Images ``[N, C, H, W]`` (uint8) and labels ``[N]`` (int64), fetched a batch at a time."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images, self.labels = images.contiguous(), labels.long().contiguous()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]

    def __getitems__(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        # DataLoader calls this with a whole batch of indices: one gather instead of N Python calls.
        t = torch.as_tensor(idx, dtype=torch.long)
        return self.images[t], self.labels[t]


@dataclass
class DataInfo:
    """What a model and the device-side normalisation need to know about the data."""

    in_shape: tuple[int, ...]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


def infer_info(sample_shape: tuple[int, ...], targets: torch.Tensor | None) -> DataInfo:
    """A DataInfo for data that came without one: the input shape of one sample; as many outputs as one float
    target has values (regression), else integer labels' max + 1 (classification), else 10."""
    if targets is not None and targets.is_floating_point():
        classes = max(1, targets[0].numel() if targets.dim() > 1 else 1)
    else:
        classes = int(targets.max()) + 1 if targets is not None and targets.numel() else 10
    c = sample_shape[0] if len(sample_shape) >= 3 else 1
    return DataInfo(tuple(sample_shape), classes, (0.0,) * c, (1.0,) * c)


Factory = Callable[[DataConfig], tuple[Dataset, Dataset, DataInfo]]
_DATASETS: dict[str, Factory] = {}


def register_dataset(name: str) -> Callable[[Factory], Factory]:
    """Decorator adding a dataset factory ``cfg -> (train, eval, info)``."""

    def deco(fn: Factory) -> Factory:
        _DATASETS[name] = fn
        return fn

    return deco


def available_datasets() -> list[str]:
    """Registered dataset names."""
    return sorted(_DATASETS)


def build_datasets(cfg: DataConfig) -> tuple[Dataset, Dataset, DataInfo | None]:
    """The training set, the evaluation set and their description (None: inferred from a sample later).

    ``data.name`` is a registered name or a user's ``package.module:function``; that builder receives
    ``cfg`` (the DataConfig) if it declares it, and returns ``train``, ``(train, eval)`` or
    ``(train, eval, DataInfo)``.
    """
    if ":" in cfg.name:
        return _user_datasets(cfg)
    if cfg.name not in _DATASETS:
        raise ConfigError("data.name", cfg.name, "one of " + ", ".join(available_datasets())
                          + ", or a builder package.module:function")
    return _DATASETS[cfg.name](cfg)


def import_data_builder(name: str) -> Callable[..., object]:
    """``package.module:function`` -> the function (found on ``PYTHONPATH``); ConfigError otherwise."""
    from ..models import import_callable
    return import_callable(name, "data.name")


def _user_datasets(cfg: DataConfig) -> tuple[Dataset, Dataset, DataInfo | None]:
    fn = import_data_builder(cfg.name)
    out = fn(cfg) if "cfg" in inspect.signature(fn).parameters else fn()
    parts = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if not 1 <= len(parts) <= 3 or not all(hasattr(d, "__len__") and hasattr(d, "__getitem__") for d in parts[:2]):
        raise ConfigError("data.name", cfg.name, "the builder must return train, (train, eval) or "
                          f"(train, eval, DataInfo) datasets; got {type(out).__name__}")
    train = parts[0]
    evals = parts[1] if len(parts) > 1 and parts[1] is not None else _EMPTY
    return train, evals, parts[2] if len(parts) == 3 else None


class _Empty(Dataset):
    def __len__(self) -> int:
        return 0

    def __getitem__(self, i: int) -> object:
        raise IndexError(i)


_EMPTY = _Empty()


def _channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    x = images.float()
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3)).clamp_min(1.0)
    return tuple(mean.tolist()), tuple(std.tolist())


@register_dataset("synthetic")
def synthetic(cfg: DataConfig) -> tuple[Dataset, Dataset, DataInfo]:
    """Deterministic uint8 images: a fixed pattern per class plus noise, so a model can learn them."""
    g = torch.Generator().manual_seed(1234)
    shape = (cfg.channels, cfg.image_size, cfg.image_size)
    templates = torch.randint(0, 256, (cfg.num_classes, *shape), generator=g, dtype=torch.uint8)

    def make(n: int) -> TensorImages:
        labels = torch.randint(0, cfg.num_classes, (n,), generator=g)
        noise = torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8)
        images = (templates[labels].to(torch.int16) * 3 + noise.to(torch.int16)) // 4
        return TensorImages(images.to(torch.uint8), labels)

    train, evals = make(cfg.train_size), make(cfg.eval_size)
    mean, std = _channel_stats(train.images)
    return train, evals, DataInfo(shape, cfg.num_classes, mean, std)


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits as (1797 x 64 pixels 0-16, labels), read from the file scikit-learn ships.

    The file is read without importing scikit-learn, which costs ~3 s in every rank of every launch here.
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("data.name", "digits", "needs scikit-learn (pip install scikit-learn)")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)  # 64 pixel columns, then the label
    return table[:, :-1], table[:, -1].astype(np.int64)


@register_dataset("digits")
def digits(cfg: DataConfig) -> tuple[Dataset, Dataset, DataInfo]:
    """scikit-learn's 1,797 handwritten digits (8x8, 10 classes): 1,500 to train, 297 to evaluate."""
    pixels, target = load_digits_arrays()
    images = torch.from_numpy((pixels * 16).clip(0, 255)).to(torch.uint8).reshape(-1, 1, 8, 8)
    labels = torch.from_numpy(target).long()
    # A fixed split, independent of the job's seed, so evaluation numbers stay comparable.
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
    tr, ev = perm[:1500], perm[1500:]
    mean, std = _channel_stats(images[tr])
    return (TensorImages(images[tr], labels[tr]), TensorImages(images[ev], labels[ev]),
            DataInfo((1, 8, 8), 10, mean, std))


# ImageNet's channel statistics on the 0-255 scale: what DeviceNormalize subtracts and divides by.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)


def _image_datasets(cfg: DataConfig, cls: type) -> tuple[Dataset, Dataset, DataInfo]:
    from .decode import resolve_decoder
    decoder = resolve_decoder(cfg.decoder)
    train = cls(cfg.path, cfg.image_size, True, decoder, key="data.path")
    evals = cls(cfg.eval_path, cfg.image_size, False, decoder, key="data.eval_path") if cfg.eval_path else \
        TensorImages(torch.empty((0, 3, cfg.image_size, cfg.image_size), dtype=torch.uint8), torch.empty(0))
    info = DataInfo((3, cfg.image_size, cfg.image_size), len(train.classes), IMAGENET_MEAN, IMAGENET_STD)
    return train, evals, info


@register_dataset("imagefolder")
def imagefolder(cfg: DataConfig) -> tuple[Dataset, Dataset, DataInfo]:
    """A class-per-folder tree of JPEG/PNG files (``data.path``), decoded in the loader's workers."""
    from .imagefolder import ImageFolder
    return _image_datasets(cfg, ImageFolder)


@register_dataset("packed")
def packed(cfg: DataConfig) -> tuple[Dataset, Dataset, DataInfo]:
    """A pack made by ``trainscale data pack`` (``data.path``), read by memory map."""
    from .packed import PackedImages
    return _image_datasets(cfg, PackedImages)
