"""Calls to an actor that Ray may be restarting: retry while it is unavailable, up to a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from .record import PsError

__all__ = ["get_when_back"]


def get_when_back(call: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``ray.get(call())``, calling again while the actor is restarting; PsError once ``timeout_s`` is spent.

    ``ActorUnavailableError`` means Ray is bringing the actor back; ``ActorDiedError`` means it gave up
    (``ps.max_restarts`` spent), which ends the wait at once.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PsError(f"{what} did not come back within ps.timeout_s = {timeout_s:g} s")
        try:
            return ray.get(call(), timeout=left)
        except ActorUnavailableError:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        except GetTimeoutError:
            raise PsError(f"{what} did not answer within ps.timeout_s = {timeout_s:g} s") from None
        except RayActorError as e:
            raise PsError(f"{what} died and Ray will not restart it ({type(e).__name__}; ps.max_restarts "
                          "may be spent)") from None
