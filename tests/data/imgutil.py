"""Small generated image folders for the data tests (made with Pillow in tmp dirs, never downloaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


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


def _root_conftest():
    """tests/conftest.py by path: another folder's conftest.py may own the module name ``conftest``."""
    import importlib.util
    import sys

    name = "trainscale_tests_root_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "conftest.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


FAST = _root_conftest().FAST
run_cli = _root_conftest().run_cli
