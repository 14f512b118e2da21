"""Shared by the data benchmarks (loader.py, data_wait.py): a generated JPEG folder and the plain DataLoader of common practice."""

# A helper of loader.py and data_wait.py, which print one json object on their last line.

from __future__ import annotations

import math
import os
import random
import statistics
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def make_jpeg_folder(root: Path, n: int, side: int, classes: int = 10, seed: int = 0) -> Path:
    """``n`` JPEGs of ``side x side`` (smooth colour fields + noise, quality 90), ``classes`` folders."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
    for i in range(n):
        d = root / f"class{i % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        a, b, c = rng.uniform(0.5, 4, 3)
        img = np.stack([np.sin(a * xx * 6 + i), np.cos(b * yy * 6), np.sin(c * (xx + yy) * 4)], -1) * 90 + 128
        img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(d / f"{i:05d}.jpg", "JPEG", quality=90)
    return root


class PlainFolder(Dataset):
    """What most scripts do (torchvision's ImageFolder + RandomResizedCrop + ToTensor + Normalize, in Pillow)."""

    def __init__(self, root: Path, size: int):
        self.size = size
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.items = [(str(f), c) for c, name in enumerate(classes) for f in sorted((root / name).glob("*.jpg"))]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        with Image.open(path) as im:
            img = im.convert("RGB")
        w, h = img.size
        for _ in range(10):  # torchvision's RandomResizedCrop
            area = w * h * random.uniform(0.08, 1.0)
            ar = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = int(round(math.sqrt(area * ar))), int(round(math.sqrt(area / ar)))
            if 0 < cw <= w and 0 < ch <= h:
                x0, y0 = random.randint(0, w - cw), random.randint(0, h - ch)
                break
        else:
            cw = ch = min(w, h)
            x0, y0 = (w - cw) // 2, (h - ch) // 2
        img = img.resize((self.size, self.size), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float().div_(255)  # ToTensor
        return (x - MEAN) / STD, label  # Normalize: float32 leaves the worker, 4x the bytes of uint8


def median_spread(values: list[float]) -> tuple[float, float]:
    med = statistics.median(values)
    return med, (max(values) - min(values)) / med if med else float("nan")


def cores() -> int:
    return len(os.sched_getaffinity(0))
