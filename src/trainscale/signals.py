"""SIGTERM takes Ctrl-C's way out: a command's cleanup (``finally``, ``except KeyboardInterrupt``) runs for both.

Example::

    with interrupt_on(signal.SIGTERM):
        out, err = proc.communicate()   # `kill` now raises KeyboardInterrupt here, and the caller cleans up
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["interrupt_on"]


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def interrupt_on(*signals: signal.Signals) -> Iterator[None]:
    """Within the block, ``signals`` raise KeyboardInterrupt; the previous handlers come back after it.

    Only the main thread may set handlers: elsewhere the block runs with the handlers as they are.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
