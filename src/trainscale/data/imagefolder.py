"""A folder of images, one sub-folder per class (``ROOT/CLASS/IMAGE.jpg``), decoded to uint8 batches.

File names are kept in one numpy byte-string array, not a Python list: a worker process that reads
a list touches every element's reference count and so copies the pages it forked (copy-on-read).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import ConfigError
from .decode import IMAGE_EXTENSIONS, DecodeError, load_crop

__all__ = ["scan_folder", "ImageFolder", "sample_rng", "Batch"]

# (images [B, C, H, W] uint8, labels [B] int64, [(file, reason, fatal), ...] of samples left out).
# Workers report bad samples instead of raising, so the training process decides (data.on_error) and
# its error names the file in one line rather than in a worker's wrapped traceback.
Batch = tuple[torch.Tensor, torch.Tensor, list[tuple[str, str, bool]]]


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The augmentation randomness of one sample in one epoch: independent of worker, rank and resume."""
    return np.random.default_rng([seed, epoch, index])


def scan_folder(root: str, key: str = "data.path") -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(file paths as bytes, labels, class names) of an image folder; a clear error when it cannot be used."""
    if not root:
        raise ConfigError(key, root, "give the image folder (ROOT/CLASS/IMAGE.jpg)")
    base = Path(root)
    if not base.is_dir():
        raise ConfigError(key, root, "no such folder (expected ROOT/CLASS/IMAGE.jpg)")
    classes = sorted(e.name for e in os.scandir(base) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ConfigError(key, root, "has no class folders (expected ROOT/CLASS/IMAGE.jpg, one folder per class)")
    paths: list[str] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        files = sorted(str(p) for p in (base / cls).rglob("*")
                       if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        if not files:
            raise ConfigError(key, str(base / cls), "class folder has no images (" + " ".join(IMAGE_EXTENSIONS)
                              + "); remove it or add images")
        paths += files
        labels += [label] * len(files)
    return np.array([p.encode() for p in paths]), np.array(labels, dtype=np.int64), classes


class ImageFolder(Dataset):
    """Images of a class-per-folder tree as ``size x size`` uint8 crops (random-resized + flip when ``train``)."""

    def __init__(self, root: str, size: int, train: bool, decoder: str, key: str = "data.path"):
        self.root, self.size, self.train, self.decoder = root, size, train, decoder
        self.paths, self.labels_np, self.classes = scan_folder(root, key)
        self.labels = torch.from_numpy(self.labels_np)

    def __len__(self) -> int:
        return len(self.labels_np)

    def get_batch(self, indices: Sequence[int], epoch: int, seed: int = 0) -> Batch:
        """Decode a batch for ``epoch``; unreadable files are dropped and reported, never raised here."""
        imgs, keep, errors = [], [], []
        for i in indices:
            try:
                rng = sample_rng(seed, epoch, i) if self.train else None
                imgs.append(load_crop(self.paths[i].decode(), self.decoder, self.size, rng))
                keep.append(i)
            except (DecodeError, OSError) as e:
                errors.append((self.paths[i].decode(), str(e), False))
        return _stack(imgs, self.size), self.labels[torch.as_tensor(keep, dtype=torch.long)], errors

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, errors = self.get_batch([i], 0, 0)
        if errors:
            raise DecodeError(f"{errors[0][0]}: {errors[0][1]}")
        return x[0], y[0]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        # Evaluation path (eval_batches): unreadable files are logged and left out.
        x, y, errors = self.get_batch(indices, 0, 0)
        if errors:
            from ..log import logger
            for f, why, _ in errors:
                logger.warning(f"skipped unreadable image {f}: {why}")
        return x, y


def _stack(imgs: list[np.ndarray], size: int) -> torch.Tensor:
    """HWC uint8 arrays -> one contiguous ``[B, C, H, W]`` uint8 tensor (one copy)."""
    if not imgs:
        return torch.empty((0, 3, size, size), dtype=torch.uint8)
    return torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).contiguous()
