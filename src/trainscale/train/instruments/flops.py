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
import torch.distributed as dist
from torch.utils import flop_counter as fc

from .peak import Peak, device_peak

__all__ = ["FlopCount", "FlopMeter", "count_flops", "flop_counter"]

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


_Inner: Any = getattr(fc, "_FlopCounterMode", None)  # the dispatch mode inside FlopCounterMode (torch >= 2.5)
if _Inner is not None:
    class _CompileAwareMode(_Inner):
        """FlopCounterMode's own dispatch mode, declared to dynamo as one that ignores compilation.

        Dynamo refuses to compile under any other dispatch mode, and then never compiles that code again: a
        count on a ``torch.compile``d model's step would leave it eager for the whole run. This one
        lets dynamo compile, and counts the compiled graph's matmuls and attention as they run (the same
        total as eager). FlopCounterMode's module tracker is left out: its global module hooks are only for
        a per-module table, and torch.compile warns about them.
        """

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True


class _Counting:
    """One count in progress: ``FlopCounterMode``'s table and formulas, entered in a way dynamo accepts."""

    def __init__(self) -> None:
        self.counter = flop_counter()
        self.mode: Any = _CompileAwareMode(self.counter) if _Inner is not None else self.counter

    def __enter__(self) -> _Counting:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)

    @property
    def flops(self) -> int:
        return int(self.counter.get_total_flops())


def count_flops(fn: Any, *args: Any, **kwargs: Any) -> int:
    """FLOPs of ``fn(*args, **kwargs)`` (call ``backward`` inside ``fn`` to count it too).

    Example::

        count_flops(lambda: model(x).sum().backward())   # forward + backward of one batch
    """
    with _Counting() as counting:
        fn(*args, **kwargs)
    return counting.flops


class FlopCount:
    """Counts this rank's model FLOPs over one optimizer step: ``start`` before its first micro-batch, ``stop`` at
    its ``run.step()``; the counter's dispatch overhead lands in that step only (a warm-up step, never timed).

    Example::

        count = FlopCount()
        count.start(); loss_fn(model(x), y).backward(); flops = count.stop()
    """

    __slots__ = ("flops", "_counting")

    def __init__(self) -> None:
        self.flops: int | None = None  # after stop(): this rank's FLOPs of the counted step
        self._counting: _Counting | None = None

    @property
    def active(self) -> bool:
        return self._counting is not None

    def start(self) -> None:
        self._counting = _Counting()
        self._counting.__enter__()  # a dispatch mode on this thread until stop(): the step's forward and backward

    def stop(self) -> int:
        """End counting; this rank's FLOPs of the step (0 when nothing was counted)."""
        counting, self._counting = self._counting, None
        if counting is None:
            return self.flops or 0
        counting.__exit__(None, None, None)
        self.flops = counting.flops
        return self.flops


class FlopMeter:
    """The run's model FLOPs per optimizer step and the job's peak FLOP/s, for MFU: counted once, in a warm-up step.

    Example::

        meter = FlopMeter(device, "bf16")
        meter.measure_peak()                    # before the first step (CPU: a matmul benchmark, cached)
        meter.at_batch(steps_done, micro, 2)    # each batch: counting starts before step 3's first micro-batch
        job = meter.at_step()                   # each run.step(): (FLOPs per step, peak) once counted (collective)
    """

    def __init__(self, device: torch.device, amp: str):
        self.device, self.amp = device, amp
        self.count = FlopCount()
        self.peak: Peak | None = None  # this rank's peak FLOP/s
        self.job: tuple[float, float] | None = None  # (the job's FLOPs per optimizer step, the job's peak FLOP/s)

    @property
    def source(self) -> str | None:
        return self.peak.source if self.peak else None

    def measure_peak(self) -> None:
        self.peak = device_peak(self.device, self.amp)

    def at_batch(self, steps_done: int, micro: int, count_step: int) -> None:
        """Start counting before the first micro-batch of the run's step ``count_step + 1`` (0-based ``count_step``)."""
        if self.count.flops is None and not micro and not self.count.active and steps_done == count_step:
            self.count.start()

    def at_step(self) -> tuple[float, float] | None:
        """At ``run.step()``: the counted step's forward and backward are done; the job's totals (collective, once)."""
        if not self.count.active or self.peak is None:
            return None
        mine = self.count.stop()
        both = torch.tensor([float(mine), self.peak.flops], dtype=torch.float64, device=self.device)
        dist.all_reduce(both)  # every rank counts its own share (a pipeline's stages differ); peaks add up
        if both[0].item() > 0:  # a host-device sync, in this one warm-up step
            self.job = (both[0].item(), both[1].item())
        return self.job

    def close(self) -> None:
        """A loop that ended inside the counted step: the counter leaves this thread."""
        self.count.stop()
