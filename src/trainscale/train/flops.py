"""Model FLOPs of one optimizer step, counted once by torch's ``FlopCounterMode`` on the run's real batch.

What is counted is what ``FlopCounterMode`` counts: matrix products (``mm``, ``addmm``, ``bmm``), convolutions
and attention, each as 2 FLOPs per multiply-add, forward and backward; element-wise work (activations,
norms, the optimizer) is not. A Linear layer costs ``2 * batch * in * out`` forward and twice that backward
(input and weight gradients), except where its input needs no gradient (a first layer): there backward is
``1x``. Attention is counted whole (``4 * b * h * s^2 * d`` forward), not halved for a causal mask, as in
nanoGPT's and PaLM's MFU. On the CPU, torch's table lacks the CPU flash-attention kernels: they are added here
with torch's own formulas.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import flop_counter as fc

__all__ = ["FlopCount", "count_flops", "flop_counter"]

_aten = torch.ops.aten


def _cpu_sdpa(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
    return fc.sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward(grad_out_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any,
                       **kwargs: Any) -> int:
    return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# The CPU kernels scaled_dot_product_attention dispatches to (torch 2.x); missing from FlopCounterMode's table.
_CPU_ATTENTION: dict[Any, Any] = {}
for _name, _fn in (("_scaled_dot_product_flash_attention_for_cpu", _cpu_sdpa),
                   ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_sdpa_backward)):
    if hasattr(_aten, _name):
        _CPU_ATTENTION[getattr(_aten, _name)] = _fn


def flop_counter() -> fc.FlopCounterMode:
    """A silent ``FlopCounterMode`` that also counts the CPU attention kernels."""
    return fc.FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION)


def count_flops(fn: Any, *args: Any, **kwargs: Any) -> int:
    """FLOPs of ``fn(*args, **kwargs)`` (call ``backward`` inside ``fn`` to count it too).

    Example::

        count_flops(lambda: model(x).sum().backward())   # forward + backward of one batch
    """
    with flop_counter() as mode:
        fn(*args, **kwargs)
    return int(mode.get_total_flops())


class FlopCount:
    """Counts this rank's model FLOPs over one optimizer step: ``start`` before its first micro-batch, ``stop`` at
    its ``run.step()``; the counter's dispatch overhead lands in that step only (a warm-up step, never timed).

    Example::

        count = FlopCount()
        count.start(); loss_fn(model(x), y).backward(); flops = count.stop()
    """

    __slots__ = ("flops", "_mode")

    def __init__(self) -> None:
        self.flops: int | None = None  # after stop(): this rank's FLOPs of the counted step
        self._mode: fc.FlopCounterMode | None = None

    @property
    def active(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        self._mode = flop_counter()
        self._mode.__enter__()  # a dispatch mode on this thread until stop(): the step's forward and backward

    def stop(self) -> int:
        """End counting; this rank's FLOPs of the step (0 when nothing was counted)."""
        mode, self._mode = self._mode, None
        if mode is None:
            return self.flops or 0
        mode.__exit__(None, None, None)
        self.flops = int(mode.get_total_flops())
        return self.flops
