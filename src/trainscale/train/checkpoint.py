"""Checkpoints: written by rank 0 after a barrier, atomically; loaded without arbitrary unpickling."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..config import ConfigError

__all__ = ["rng_state", "set_rng_state", "save_checkpoint", "load_checkpoint", "atomic_write_bytes"]


def rng_state() -> dict[str, Any]:
    """This process's RNG states, as tensors and plain values (loadable with weights_only)."""
    np_state = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    torch.set_rng_state(state["torch"])
    random.setstate(tuple(state["python"][:1]) + (tuple(state["python"][1]),) + tuple(state["python"][2:]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def atomic_write_bytes(path: str | Path, write: Any) -> None:
    """Write through ``write(fileobj)`` to a temp file beside ``path``, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(path: str | Path, state: dict[str, Any], rank: int, world: int) -> None:
    """Collective: gather every rank's RNG state, then rank 0 writes ``state`` atomically."""
    rngs: list[Any] = [None] * world
    dist.all_gather_object(rngs, rng_state())
    dist.barrier()  # every rank has finished the step being saved
    if rank == 0:
        atomic_write_bytes(path, lambda f: torch.save({**state, "rng": rngs}, f))
    dist.barrier()  # nobody reads or prunes before the file is complete


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a trainscale checkpoint on the CPU; a missing, truncated or foreign file is a ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("--resume", str(path), "no such checkpoint file")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for truncated or non-checkpoint files
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ConfigError("--resume", str(path), f"not a readable checkpoint (truncated or corrupt?): {reason}") from None
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise ConfigError("--resume", str(path), "not a trainscale checkpoint (no model/step)")
    return state
