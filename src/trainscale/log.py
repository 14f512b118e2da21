"""The one named logger of trainscale: rank 0 logs at the chosen level, other ranks at debug only."""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["logger", "setup_logging"]

logger = logging.getLogger("trainscale")


def setup_logging(level: str = "info", rank: int | None = None) -> None:
    """Send trainscale's log to stderr, prefixed with the rank when there are several."""
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world = int(os.environ.get("WORLD_SIZE", "1"))
    chosen = getattr(logging, level.upper(), logging.INFO) if rank == 0 else logging.WARNING
    if rank != 0 and os.environ.get("TRAINSCALE_DEBUG"):
        chosen = logging.DEBUG
    prefix = f"[rank{rank}] " if world > 1 else ""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prefix}%(message)s"))
    logger.handlers[:] = [handler]
    logger.setLevel(chosen)
    logger.propagate = False
