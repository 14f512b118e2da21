"""The one atomic write: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_bytes", "write_json"]


def atomic_write_bytes(path: str | Path, write: Callable[[Any], None]) -> None:
    """Write through ``write(fileobj)`` to a temp file beside ``path``, then rename over it.

    Example::

        atomic_write_bytes("out/latest", lambda f: f.write(b"step-100\\n"))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the rename must not reach the disk before the bytes do
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON, atomically (a crash keeps the previous file)."""
    text = json.dumps(data, indent=2, default=str) + "\n"
    atomic_write_bytes(path, lambda f: f.write(text.encode()))
