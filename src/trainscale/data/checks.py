"""Start-up checks of the input pipeline: warnings that say what to change before the run is slow or dies."""

from __future__ import annotations

import math
import shutil
from typing import Any

from torch.utils.data import Dataset

__all__ = ["startup_warnings", "shm_free_bytes", "python_list_attrs", "data_wait_advice"]

# DataLoader's default: each worker keeps this many batches in flight in shared memory.
PREFETCH_FACTOR = 2
LIST_LIMIT = 1000


def shm_free_bytes(path: str = "/dev/shm") -> int | None:
    """Free bytes of the shared-memory file system that worker processes hand batches through."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def python_list_attrs(dataset: Dataset, limit: int = LIST_LIMIT) -> list[tuple[str, int]]:
    """Attributes of ``dataset`` that are Python lists/tuples/dicts longer than ``limit``: (name, length)."""
    found = []
    for name, value in vars(dataset).items() if hasattr(dataset, "__dict__") else []:
        if isinstance(value, (list, tuple, dict)) and len(value) > limit:
            found.append((name, len(value)))
    return found


def startup_warnings(dataset: Dataset, in_shape: tuple[int, ...], batch_size: int, workers: int, prefetch: int,
                     shm_free: Any = "probe") -> list[str]:
    """What would make this loader slow or crash, each with the knob to turn; empty when all is well."""
    out: list[str] = []
    if workers > 0:
        batch_bytes = batch_size * (math.prod(in_shape) + 8)  # uint8 pixels + int64 label
        need = batch_bytes * (workers * PREFETCH_FACTOR + prefetch + 1)
        free = shm_free_bytes() if shm_free == "probe" else shm_free
        if free is not None and free < 2 * need:
            out.append(f"/dev/shm has {free / 2**20:.0f} MiB free but {workers} workers x {PREFETCH_FACTOR} batches "
                       f"+ prefetch {prefetch} need about {need / 2**20:.0f} MiB (x2 headroom): workers may die with "
                       "'bus error'; enlarge it (docker run --shm-size=8g) or lower data.workers / data.prefetch "
                       "/ data.batch_size")
        for name, n in python_list_attrs(dataset):
            out.append(f"dataset attribute {type(dataset).__name__}.{name} is a Python container of {n:,} objects: "
                       f"each of the {workers} workers copies the pages it reads (copy-on-read through reference "
                       "counts), so memory grows with workers; keep it as a numpy array or tensor, or pack the "
                       "images with `trainscale data pack`")
    return out


WAIT_LIMIT = 0.10


def data_wait_advice(wait_frac: float, cfg: Any) -> str | None:
    """The warning for a run whose steps waited more than 10% of their time for data, naming the knob."""
    if not wait_frac > WAIT_LIMIT:  # also false for nan
        return None
    knobs = [f"raise data.workers (now {cfg.workers})"]
    if cfg.prefetch < 2:
        knobs.append(f"data.prefetch (now {cfg.prefetch}) to 2 or more")
    if cfg.name == "imagefolder":
        knobs.append("pack the folder once (`trainscale data pack SRC DST --size S`, then --data.name packed)")
        if cfg.decoder != "opencv":
            knobs.append("install opencv-python-headless (a faster decoder)")
    return (f"steps waited for data {wait_frac:.0%} of their time (over {WAIT_LIMIT:.0%}): the input pipeline is "
            "the bottleneck; " + ", ".join(knobs))
