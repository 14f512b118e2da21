"""The loss window: the loss stays on the device between log points, then leaves it in one host sync."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from ...log import logger

__all__ = ["LossWindow"]


class LossWindow:
    """Sums each optimizer step's loss on the device; at a log point, the window's mean, rate and curve point.

    Example::

        window = LossWindow(device, every=20)
        window.add(loss.detach())              # per micro-batch, no host sync
        point = window.step_done(step, last)   # None, or {"loss": ..., "step_time_s": ...} at a log point
    """

    def __init__(self, device: torch.device, every: int):
        self.every = every
        self._step_sum: torch.Tensor | None = None  # this optimizer step's micro-batch losses
        self._window = torch.zeros((), device=device)
        self._n = 0
        self.first: torch.Tensor | None = None
        self.last: torch.Tensor | None = None
        self.curve: list[tuple[int, float, float]] = []  # (step, seconds into the loop, loss) at log points
        self._warned_nan = False
        self.t_loop = self._t_window = time.perf_counter()

    def start(self) -> None:
        """The loop starts now (its first batch is about to be taken)."""
        self.t_loop = self._t_window = time.perf_counter()

    def add(self, loss: torch.Tensor) -> None:
        """One micro-batch's loss (a scalar on the device; divided by the accumulation count already)."""
        d = loss.detach().float().reshape(())
        self._step_sum = d if self._step_sum is None else self._step_sum + d

    def step_done(self, step: int, last: bool, share: Callable[[torch.Tensor], Any]) -> dict[str, float] | None:
        """Close optimizer step ``step``; at a log point (every ``every`` steps, and the last) the window's figures.

        ``share`` puts the loss where it lives on every rank (a pipeline's last stage: collective).
        """
        loss = self._step_sum if self._step_sum is not None else torch.zeros_like(self._window)
        self._step_sum = None
        if self.first is None:
            self.first = loss.clone()
        self.last = loss
        self._window += loss
        self._n += 1
        if step % self.every and not last:
            return None
        share(self._window)
        mean = (self._window / self._n).item()  # the loop's only host sync: metrics leave the device here
        if not math.isfinite(mean) and not self._warned_nan:
            self._warned_nan = True
            logger.warning(f"loss is {mean} at step {step}: the run diverged (lower the learning rate or add warm-up)")
        now = time.perf_counter()
        self.curve.append((step, round(now - self.t_loop, 4), mean))
        point = {"loss": mean, "steps": self._n, "window_s": max(now - self._t_window, 1e-9), "time_s": now - self.t_loop}
        self._window.zero_()
        self._n, self._t_window = 0, time.perf_counter()
        return point

    def first_last(self, device: torch.device) -> torch.Tensor:
        """[first loss, last loss] of this rank (NaN where no step ran), for the summary's all-reduce."""
        nan = torch.full((), float("nan"), device=device)
        return torch.stack([self.first if self.first is not None else nan,
                            self.last if self.last is not None else nan]).float()
