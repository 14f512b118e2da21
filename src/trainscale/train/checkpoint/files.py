"""Checkpoint files: written atomically, published through a "latest" pointer, found again after a crash.

A checkpoint folder holds ``step_N.pt`` files (one file, rank 0 writes) or ``step_N/`` folders (sharded,
``torch.distributed.checkpoint``: every rank writes its own part), ``last.pt`` / ``last/`` at the end, and
``latest``: one line naming the newest complete checkpoint, replaced atomically after each one is complete.
A crash mid-write leaves the pointer on the previous checkpoint. Loading never unpickles arbitrary objects.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ...config import ConfigError
from ...log import logger
from ...reporting.files import atomic_write_bytes

__all__ = ["rng_state", "set_rng_state", "save_checkpoint", "load_checkpoint", "CheckpointWriteError", "LATEST", "publish_latest", "checkpoint_candidates", "is_sharded",
           "state_bytes", "check_free_space", "write_error", "prune"]

LATEST = "latest"  # the pointer file's name inside a checkpoint folder


class CheckpointWriteError(ConfigError):
    """A checkpoint could not be written (folder unwritable or full); the previous one is intact."""


def rng_state() -> dict[str, Any]:
    """This process's RNG states, as tensors and plain values (loadable with weights_only)."""
    np_state: tuple[Any, ...] = np.random.get_state()  # type: ignore[assignment]  # the legacy tuple form (legacy=True)
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
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


def state_bytes(state: Any) -> int:
    """Bytes of the tensors in a (nested) state: what a checkpoint of it needs on disk, give or take headers."""
    if torch.is_tensor(state):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def check_free_space(folder: Path, needed: int) -> None:
    """Raise ENOSPC before writing when the folder's file system plainly lacks ``needed`` bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({free} bytes free)")


def write_error(path: Path, err: BaseException, needed: int) -> CheckpointWriteError:
    """The one line for a failed checkpoint write: folder, file, OS reason, bytes needed, what is intact."""
    folder = path.parent
    latest = read_latest(folder)
    reason = f"[Errno {err.errno}] {err.strerror}" if isinstance(err, OSError) and err.strerror else str(err)
    try:
        free = f", {shutil.disk_usage(folder).free} free"
    except OSError:
        free = ""
    kept = f"the previous checkpoint {latest} is intact" if latest else "no earlier checkpoint in it"
    return CheckpointWriteError("checkpoint.dir", str(folder), f"cannot write {path.name}: {reason} (needs about "
                                f"{needed} bytes{free}); {kept}; give a writable folder with room")


def save_checkpoint(path: str | Path, state: dict[str, Any], rank: int, world: int,
                    during: Callable[[], None] | None = None) -> None:
    """Collective: gather every rank's RNG state, then rank 0 writes ``state`` atomically and publishes it.

    A write that fails (unwritable or full folder) raises CheckpointWriteError on every rank; the
    previous checkpoint and the ``latest`` pointer stay as they were. ``during`` runs halfway through this
    rank's part of the write (fault injection).
    """
    path = Path(path)
    rngs: list[Any] = [None] * world
    dist.all_gather_object(rngs, rng_state())
    dist.barrier()  # every rank has finished the step being saved
    outcome: list[Any] = [None]
    if rank != 0 and during is not None:
        during()
    if rank == 0:
        full = {**state, "rng": rngs}
        needed = state_bytes(full) + 64 * 1024  # pickled structure and zip headers on top of the tensors
        try:
            check_free_space(path.parent, needed)
            def write(f: Any) -> None:
                torch.save(full, f)
                if during is not None:
                    during()  # the watchdog's beat between the write and the rename
            atomic_write_bytes(path, write)
            publish_latest(path)
        except OSError as e:
            err = write_error(path, e, needed)
            outcome[0] = (err.key, err.value, err.accepted)
    # Every rank learns the outcome (and nobody reads or prunes before the file is complete).
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0]:
        raise CheckpointWriteError(*outcome[0])


def publish_latest(path: Path) -> None:
    """Point ``latest`` in ``path``'s folder at ``path`` (atomic: readers see the old or the new name)."""
    atomic_write_bytes(path.parent / LATEST, lambda f: f.write((path.name + "\n").encode()))


def read_latest(folder: Path) -> str | None:
    """The name ``latest`` points at, or None."""
    try:
        name = (Path(folder) / LATEST).read_text().strip()
    except OSError:
        return None
    return name or None


def is_sharded(path: Path) -> bool:
    """A sharded (DCP) checkpoint: a folder with DCP's ``.metadata``."""
    return Path(path).is_dir() and (Path(path) / ".metadata").is_file()


def checkpoint_candidates(folder: Path) -> list[Path]:
    """Checkpoints in ``folder``, newest first: the one ``latest`` names, then the others by modification time."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if (p.name.startswith("step_") or p.stem == "last") and not
             p.name.startswith(".") and (p.suffix == ".pt" and p.is_file() or is_sharded(p))]
    found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    named = read_latest(folder)
    first = [p for p in found if p.name == named]
    return first + [p for p in found if p.name != named]


def prune(folder: Path, keep: int) -> None:
    """Keep the ``keep`` newest ``step_*`` checkpoints (never the one ``latest`` names, never ``last``)."""
    named = read_latest(folder)
    steps = [p for p in Path(folder).glob("step_*") if p.name != named and (p.suffix == ".pt" or is_sharded(p))]
    steps.sort(key=lambda q: int(q.name.split("_")[1].split(".")[0]))
    for q in steps[:max(0, len(steps) - (keep - 1))]:
        shutil.rmtree(q, ignore_errors=True) if q.is_dir() else q.unlink(missing_ok=True)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a one-file trainscale checkpoint on the CPU; a missing, truncated or foreign file is a ConfigError."""
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


def warn_skipped(path: Path, err: Exception) -> None:
    """Say that a newer checkpoint was unreadable and an older one is used instead."""
    logger.warning(f"checkpoint {path} is unreadable ({err}); falling back to the previous one")
