"""Ray for the length of one command: started (or joined) on entry, stopped on exit, error, Ctrl-C or SIGTERM."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from ..log import logger
from ..signals import interrupt_on

__all__ = ["ray_session"]


def _init(ray: object, kwargs: dict, verbose: bool, tries: int = 2) -> None:
    """ray.init, tried again once when a local start times out: Ray gives its raylet a fixed 30 s to register,
    which a machine busy with other work can exceed (seen at load 7-9 on 2 cores)."""
    for attempt in range(1, tries + 1):
        try:
            ray.init(include_dashboard=False, log_to_driver=verbose,  # type: ignore[attr-defined]
                     logging_level=logging.INFO if verbose else logging.WARNING, **kwargs)
            return
        except Exception as e:  # Ray raises a bare Exception for this one
            if "address" in kwargs or "timed out during startup" not in str(e) or attempt == tries:
                raise
            logger.warning("Ray did not start in time (%s); trying once more", e)
            ray.shutdown()  # type: ignore[attr-defined]


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None, verbose: bool = False) -> Iterator[None]:
    """Start a local Ray instance (or connect to ``address``) and shut it down however the block ends.

    A Ray that is already initialised in this process (a test session) is used and left running.
    """
    import ray

    started = False
    # SIGTERM (a scheduler, `kill`) and SIGINT take the same way out, through the finally below. SIGINT is set
    # explicitly: a process started with SIGINT ignored (inherited) would otherwise run on after Ctrl-C.
    with interrupt_on(signal.SIGTERM, signal.SIGINT):
        # `kill -USR1 PID` prints every thread's stack: what a run that does not stop is waiting for.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        try:
            if not ray.is_initialized():
                kwargs = {"address": address} if address else {"num_cpus": num_cpus or os.cpu_count() or 1}
                started = True
                _init(ray, kwargs, verbose)
            yield
        finally:
            if started:
                ray.shutdown()
            faulthandler.unregister(signal.SIGUSR1)
