"""Mixed precision as PyTorch's AMP recipe writes it: autocast around the forward *and* the loss, nothing cast back."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

__all__ = ["AutocastRegion"]


class AutocastRegion:
    """The run's autocast region: opened by the prepared model's forward, closed by the run's next call.

    A user's loop on the run API computes its loss after ``model(x)`` has returned
    (``run.backward(loss_fn(model(x), y))``), so the region opened for the forward stays open until the run is
    called again (``run.backward``, ``clip_gradients``, ``step``, the next batch, ``model.train()``/``eval()``,
    ``evaluate``, ``finish``): the loss runs under autocast, as in ``with torch.autocast(...): loss =
    loss_fn(model(x), y)``. Losses on autocast's float32 list (``cross_entropy``, ``mse_loss``, ...) compute in
    float32 and no output is copied. Backward runs outside it, as the recipe says. Where autocast is on already
    (the user's own ``torch.autocast``), the forward runs in a nested region of the run's, as before, and the
    user's region decides the loss's precision. ``scoped``: the opt-in ``strategy.amp_cast_outputs``, the region
    ends with the forward and the caller casts the outputs; so it does where torch.compile traces the forward.

    Example::

        region = AutocastRegion(strategy.autocast)
        out = region.forward(model, x)    # under autocast; the region stays open
        loss = loss_fn(out, y)            # under autocast too: cross_entropy in float32
        region.close()                    # before backward
    """

    __slots__ = ("factory", "device", "scoped", "_open", "_level")

    def __init__(self, factory: Callable[[], AbstractContextManager], scoped: bool = False):
        self.factory, self.scoped = factory, scoped
        probe = factory()
        self.device: str | None = probe.device if isinstance(probe, torch.autocast) else None  # None: no autocast
        self._open: AbstractContextManager | None = None
        self._level = 0  # autocast's nesting count with the region open

    @property
    def is_open(self) -> bool:
        return self._open is not None

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` under the run's autocast, the region left open for the loss."""
        if self.device is None:
            return fn(*args, **kwargs)
        if self._open is None and not self.scoped and not self.traced() and not torch.is_autocast_enabled(self.device):
            self._enter()
        if self._open is not None:
            return fn(*args, **kwargs)
        with self.factory():
            return fn(*args, **kwargs)

    def traced(self) -> bool:
        """Whether torch.compile traces this forward (the prepared model compiled after ``run.prepare``): a region
        cannot outlive the compiled frame, so it ends with the forward and the caller casts the outputs."""
        return self.device is not None and torch.compiler.is_compiling()

    def _enter(self) -> None:
        region = self.factory()
        region.__enter__()
        self._open, self._level = region, _nesting()

    def close(self) -> None:
        """End the region (the loss is computed): cheap when none is open."""
        if self._open is None:
            return
        if _nesting() != self._level:
            # A region the user opened after the forward is still open: ending ours inside it would let theirs
            # restore ours when it ends. It ends at the run's next call instead.
            return
        region, self._open = self._open, None
        region.__exit__(None, None, None)


def _nesting() -> int:
    """How many autocast regions are open on this thread (PyTorch keeps the count for its cast cache)."""
    level = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return level
