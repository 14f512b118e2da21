"""The loss window: the loss stays on the device between log points, then leaves it without a host sync."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from ...log import logger

__all__ = ["LossWindow"]


class LossWindow:
    """Sums each optimizer step's loss on the device; at a log point, the window's mean leaves for the host without
    the host waiting, and is read at the next log point (or at once at the last step), long after it arrived.

    Example::

        window = LossWindow(device, every=20)
        window.add(loss.detach())               # per micro-batch, no host sync
        point = window.step_done(step, last)    # None, or the closed window's figures (its loss on the way)
        rows = window.ready(final=last)         # the closed windows whose loss is read: {"loss": ..., "step": ...}
    """

    def __init__(self, device: torch.device, every: int):
        self.every = every
        self._step_sum: torch.Tensor | None = None  # this optimizer step's micro-batch losses
        self._window = torch.zeros((), device=device)
        self._n = 0
        self.first: torch.Tensor | None = None
        self.last: torch.Tensor | None = None
        self.curve: list[tuple[int, float, float]] = []  # (step, seconds into the loop, loss) at log points
        self._pending: list[tuple[dict[str, Any], _HostCopy]] = []  # closed windows, their mean on its way
        self._warned_nan = False
        self.t_loop = self._t_window = time.perf_counter()

    def start(self) -> None:
        """The loop starts now (its first batch is about to be taken)."""
        self.t_loop = self._t_window = time.perf_counter()

    def add(self, loss: torch.Tensor) -> None:
        """One micro-batch's loss (a scalar on the device; divided by the accumulation count already)."""
        d = loss.detach().float().reshape(())
        self._step_sum = d if self._step_sum is None else self._step_sum + d

    def step_done(self, step: int, last: bool, share: Callable[[torch.Tensor], Any]) -> dict[str, Any] | None:
        """Close optimizer step ``step``; at a log point (every ``every`` steps, and the last) the window's figures
        without its loss, which ``ready`` gives once it has reached the host.

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
        mean = _HostCopy(self._window / self._n)  # queued behind the step's work: the host does not wait for it
        now = time.perf_counter()
        point = {"step": step, "steps": self._n, "window_s": max(now - self._t_window, 1e-9), "time_s": now - self.t_loop}
        self._pending.append((point, mean))
        self._window.zero_()
        self._n, self._t_window = 0, time.perf_counter()
        return point

    def ready(self, final: bool = False) -> list[dict[str, Any]]:
        """The closed windows before the newest, with their loss read (``final``: the newest too, waiting for it)."""
        take = self._pending if final else self._pending[:-1]
        self._pending = [] if final else self._pending[-1:]
        for point, mean in take:
            point["loss"] = loss = mean.read()
            if not math.isfinite(loss) and not self._warned_nan:
                self._warned_nan = True
                logger.warning(f"loss is {loss} at step {point['step']}: the run diverged (lower the learning rate "
                               "or add warm-up)")
            self.curve.append((point["step"], round(point["time_s"], 4), loss))
        return [point for point, _ in take]

    def first_last(self, device: torch.device) -> torch.Tensor:
        """[first loss, last loss] of this rank (NaN where no step ran), for the summary's all-reduce."""
        nan = torch.full((), float("nan"), device=device)
        return torch.stack([self.first if self.first is not None else nan,
                            self.last if self.last is not None else nan]).float()


class _HostCopy:
    """A device scalar copied to host memory without the host waiting; read once the device has passed the copy.

    On CUDA a non-blocking copy into pinned memory and an event: reading one log point later finds the event
    done. On a CPU the device is the host: a copy into a host buffer, read from it later the same way.
    """

    __slots__ = ("host", "done")

    def __init__(self, value: torch.Tensor):
        cuda = value.device.type == "cuda"
        self.host = torch.empty((), dtype=value.dtype, pin_memory=cuda)
        self.host.copy_(value, non_blocking=cuda)
        self.done: Any = None
        if cuda:
            self.done = torch.cuda.Event()
            self.done.record()

    def read(self) -> float:
        if self.done is not None:
            self.done.synchronize()  # long done when read a window later; the last step's read waits here
        return float(self.host.numpy())
