"""Communication accounting: bytes and collective calls per step, and communication left exposed after backward.

Bytes are counted as a ring algorithm sends them (``trainscale.costs.collectives.collective_bytes``): an
all-reduce of N bytes over P ranks sends 2N(P-1)/P from each rank, a reduce-scatter or an all-gather N(P-1)/P.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from ..costs.collectives import collective_bytes

__all__ = ["CommMeter"]

class CommMeter:
    """Counts what this rank sends per optimizer step; hooks call ``collective``, the trainer ``end_step``.

    Without a hook (DDP's built-in all-reduce) nothing is counted per call: ``fixed_bytes`` and
    ``fixed_calls`` give the step's volume from the gradient sizes, so the default path stays untouched.
    """

    __slots__ = ("fixed_bytes", "fixed_calls", "counted", "_bytes", "_calls", "step_bytes", "step_calls",
                 "_t_grad", "waits", "_handles", "blocked_is_exposed")

    def __init__(self) -> None:
        self.fixed_bytes: float | None = None
        self.fixed_calls: int | None = None
        self.counted = False  # True once a hook reports its collectives
        self._bytes, self._calls = 0.0, 0
        self.step_bytes: list[float] = []
        self.step_calls: list[int] = []
        self._t_grad = 0.0
        self.waits: list[float] = []
        self._handles: list[Any] = []
        # FSDP: collectives all through forward and backward, no gradient seam to time from. On CPU the training
        # thread blocks (off-CPU) only in its data wait and in the collectives' waits, so the accounting measures
        # the exposed communication as the step's off-CPU, not-runnable time outside the data wait.
        self.blocked_is_exposed = False

    def collective(self, kind: str, nbytes: int, group_size: int, calls: int = 1) -> None:
        """Record a collective of ``nbytes`` (full tensor) among ``group_size`` ranks (``calls`` launches)."""
        self.counted = True
        self._bytes += collective_bytes(kind, nbytes, group_size)
        self._calls += calls

    def end_step(self) -> None:
        """Close the step's count (cheap: two appends)."""
        self.step_bytes.append(self._bytes)
        self.step_calls.append(self._calls)
        self._bytes, self._calls = 0.0, 0

    # ---- exposed communication: from the last gradient computed to the end of backward (CPU only)

    def watch_gradients(self, module: nn.Module) -> None:
        """Time-stamp every gradient accumulation; on CUDA host times say nothing about the device, so skip."""
        for p in module.parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))

    def _grad_ready(self, _p: torch.Tensor) -> None:
        self._t_grad = time.perf_counter()

    @property
    def hooked(self) -> bool:
        """Whether gradients are time-stamped (CPU): ``last_gradient_s`` and ``waits`` are then measured."""
        return bool(self._handles)

    @property
    def last_gradient_s(self) -> float:
        """``time.perf_counter()`` when the latest gradient was accumulated (0 before the first)."""
        return self._t_grad

    def backward_done(self) -> None:
        """Called when backward (DDP's wait for its last bucket included) has returned."""
        if self._handles:
            self.waits.append(max(0.0, time.perf_counter() - self._t_grad))

    def exposed(self, seconds: float) -> None:
        """Communication done after backward (overlap false): all of it is exposed."""
        self.waits.append(seconds)

    # ---- summary

    def summary(self, skip: int, ablated: bool) -> dict[str, Any]:
        """``comm_bytes_per_step`` (mean over the steps after ``skip``), calls and exposed wait per step."""
        out: dict[str, Any] = {}
        if ablated:
            out["comm_bytes_per_step"] = 0.0
        elif self.counted or self.fixed_bytes is None:
            b = self.step_bytes[skip:] or self.step_bytes
            c = self.step_calls[skip:] or self.step_calls
            out["comm_bytes_per_step"] = sum(b) / len(b) if b else 0.0
            out["comm_calls_per_step"] = sum(c) / len(c) if c else 0.0
        else:
            out["comm_bytes_per_step"] = self.fixed_bytes
        w = self.waits[skip:] or self.waits
        out["comm_wait_s"] = sum(w) / len(w) if w else None
        return out
