"""The end of each backward graph on CPU, marked by one hook kept on one parameter instead of a hook per step.

The compute clock (``ComputeClock.watch``) marks the graph's end with a hook on every step's loss and an autograd
callback queued from it: registered, called and queued anew each step, they cost the training thread more CPU
than the rest of the injection together (``benchmarks/inject_overhead.py``). A DDP model's graph ends when the
gradient of the parameter DDP's reducer gets last is accumulated (every node after it is DDP's own finalize). That
parameter is learned once: the first watched backward hooks every parameter of the script's DDP models with
``register_post_accumulate_grad_hook``, and the one that fires last keeps its hook; the others are removed. The
hook adds that backward's forward + backward to the clock (``ComputeClock.add``), as the clock's own mark does.

A backward whose kept hook did not fire (a branch of the model left out, a second loss) is marked where backward
returns, and the clock's own per-step hook is used from then on. On CUDA, where the clock records events on the
device, on a PyTorch without the hook, and with ``TRAINSCALE_INJECT_SKIP=graph_end``, the clock's own mark is
used throughout.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["GraphEnd"]


class GraphEnd:
    """One rank's graph-end mark: ``LEARN`` (next backward learns the last parameter), ``KEPT``, or ``OFF``.

    Example::

        end = GraphEnd(ins.clock, ddps)
        if end.begin():              # True: this backward is marked here, not by the clock's loss hook
            ...backward...
            end.done()
    """

    LEARN, KEPT, OFF = "learn", "kept", "off"

    __slots__ = ("clock", "state", "fired", "_handles", "_order", "_params", "_last")

    def __init__(self, clock: Any, ddps: list[Any]):
        self.clock, self.fired, self._last = clock, False, 0.0
        self._handles: list[Any] = []
        self._order: list[int] = []
        self._params = params = [p for d in ddps for p in d.module.parameters() if p.requires_grad]
        usable = (not clock.cuda and bool(params)
                  and all(hasattr(p, "register_post_accumulate_grad_hook") for p in params))
        self.state = self.LEARN if usable else self.OFF
        if usable:
            self._handles = [p.register_post_accumulate_grad_hook(self._learner(i)) for i, p in enumerate(params)]

    def _learner(self, i: int) -> Any:
        def seen(p: torch.Tensor) -> None:
            self._order.append(i)
            self._mark(p)
        return seen

    def _mark(self, p: torch.Tensor) -> None:
        """The graph's last gradient is accumulated: this backward's compute ends now (later calls move it)."""
        clock = self.clock
        now = time.perf_counter()
        if self.fired and self.state == self.LEARN:  # every parameter fires while learning: the last one counts
            clock.spent -= self._last
        self._last = now - clock.t0
        clock.add(self._last)
        self.fired = True

    @property
    def param(self) -> torch.Tensor | None:
        """The parameter whose hook is kept (None unless ``KEPT``)."""
        return self._params[0] if self.state == self.KEPT else None

    def begin(self) -> bool:
        """Before backward: True when this mark times it (the clock's own hook is then not needed)."""
        self.fired = False
        return self.state != self.OFF

    def done(self) -> None:
        """After backward: settle the learned parameter, or fall back when the kept hook did not fire."""
        if self.state == self.LEARN:  # keep the last one's hook, now calling the mark alone
            last = self._order[-1] if self._order else None
            self._params = [self._params[last]] if last is not None else []
            self.state = self.KEPT if last is not None else self.OFF
            self._order = []
            self.hold(True)
        if not self.fired:
            self.clock.add(time.perf_counter() - self.clock.t0)  # marked late: it holds the exchange's wait
            self.off()

    def off(self) -> None:
        """Back to the clock's own per-step hook."""
        for h in self._handles:
            h.remove()
        self._handles, self._params, self.state = [], [], self.OFF

    def hold(self, on: bool) -> None:
        """Take the kept hook off its parameter, or put it back (a benchmark's plain and instrumented chunks)."""
        if self.state == self.LEARN:
            return
        for h in self._handles:
            h.remove()
        self._handles = [p.register_post_accumulate_grad_hook(self._mark) for p in self._params] \
            if on and self.state == self.KEPT else []
