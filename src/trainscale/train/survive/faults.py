"""Fault injection for tests and soaks: a real signal sent by a rank to itself at a chosen step.

``TRAINSCALE_FAULT=ACTION@STEP:RANK[:checkpoint]`` with ACTION ``kill`` (SIGKILL), ``stop`` (SIGSTOP) or
``term`` (SIGTERM): rank RANK signals itself when it has done STEP steps (at the step boundary, or halfway
through writing the checkpoint of that step with ``:checkpoint``). Only the first attempt of a torchrun job
is hit, so a restart runs clean.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

__all__ = ["Fault", "fault_from_env", "ENV_FAULT"]

ENV_FAULT = "TRAINSCALE_FAULT"
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "term": signal.SIGTERM}


@dataclass(frozen=True)
class Fault:
    """One injected fault."""

    action: str
    step: int
    rank: int
    where: str = "step"

    def hit(self, step: int, where: str = "step") -> None:
        """Send the signal when this is the chosen place."""
        if step == self.step and where == self.where:
            os.kill(os.getpid(), SIGNALS[self.action])


def fault_from_env(rank: int) -> Fault | None:
    """This rank's fault from ``TRAINSCALE_FAULT`` (None: none, another rank's, or a restarted attempt)."""
    spec = os.environ.get(ENV_FAULT, "")
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    try:
        head, rest = spec.split("@", 1)
        parts = rest.split(":")
        fault = Fault(head, int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "step")
    except (ValueError, IndexError):
        raise ValueError(f"{ENV_FAULT} = {spec!r}: expected ACTION@STEP:RANK[:checkpoint], ACTION one of "
                         + ", ".join(SIGNALS)) from None
    if fault.action not in SIGNALS or fault.where not in ("step", "checkpoint"):
        raise ValueError(f"{ENV_FAULT} = {spec!r}: ACTION one of {', '.join(SIGNALS)}, place step or checkpoint")
    return fault if fault.rank == rank else None
