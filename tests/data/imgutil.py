"""Small generated image folders for the data tests (made with Pillow in tmp dirs, never downloaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from clitools import FAST, run_cli  # noqa: F401  (re-exported for the data tests)


def make_folder(root: Path, classes: int = 3, per_class: int = 14, side: int = 32, fmt: str = "JPEG",
                seed: int = 0) -> Path:
    """``root/cK/I.jpg``: images of slightly varied sizes, class-dependent colour so a model can learn them."""
    rng = np.random.default_rng(seed)
    ext = {"JPEG": "jpg", "PNG": "png"}[fmt]
    for c in range(classes):
        d = root / f"c{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = side + (i % 3) * 2, side + (i % 4)
            img = rng.integers(0, 96, (h, w, 3), dtype=np.uint8)
            img[..., c % 3] += 150
            Image.fromarray(img).save(d / f"{i:03d}.{ext}", fmt)
    return root
