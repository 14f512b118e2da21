"""Ray for the length of one command: started (or joined) on entry, stopped on exit, error, Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
from contextlib import contextmanager
from typing import Iterator

__all__ = ["ray_session"]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None, verbose: bool = False) -> Iterator[None]:
    """Start a local Ray instance (or connect to ``address``) and shut it down however the block ends.

    A Ray that is already initialised in this process (a test session) is used and left running.
    """
    import ray

    started = False
    # SIGTERM (a scheduler, `kill`) takes the same way out as Ctrl-C, through the finally below.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if not ray.is_initialized():
            kwargs = {"address": address} if address else {"num_cpus": num_cpus or os.cpu_count() or 1}
            ray.init(include_dashboard=False, log_to_driver=verbose,
                     logging_level=logging.INFO if verbose else logging.WARNING, **kwargs)
            started = True
        yield
    finally:
        if started:
            ray.shutdown()
        signal.signal(signal.SIGTERM, previous)
