"""The device's peak FLOP/s for MFU: the planner's catalogue for a known GPU, else a short matmul benchmark."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache

import torch

from ...costs.hardware import catalog

__all__ = ["Peak", "device_peak", "catalog_peak", "measured_peak", "precision_of", "bf16_native"]

_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Peak:
    """One device's peak FLOP/s at the run's precision, and where the number comes from."""

    flops: float  # FLOP/s of one device (rank)
    source: str   # "catalog: H100 bf16" or "measured: ..." (a benchmark on this rank)


def precision_of(amp: str, device: torch.device) -> str:
    """The matmul precision the run's model computes in: its autocast type, or fp32 (tf32 where CUDA allows it)."""
    if amp in ("bf16", "fp16"):
        return amp
    if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "fp32"


def bf16_native(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 in hardware (a CUDA GPU that supports it; a CPU with AVX-512 BF16 or
    AMX). Elsewhere bf16 is emulated, slower than fp32 (an AVX2 host: the GPT example's 120 steps took over 4
    minutes in bf16 and 42 s in fp32)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    # torch.cpu's checks are private: a torch without them is taken as having neither.
    return bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
                or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def device_peak(device: torch.device, amp: str) -> Peak:
    """Peak FLOP/s of ``device`` at ``amp``'s precision: the catalogue's for a GPU it names, else measured.

    Example::

        device_peak(torch.device("cpu"), "none")   # Peak(flops=3.1e10, source='measured: fp32 matmul on this cpu rank')
    """
    precision = precision_of(amp, device)
    if device.type == "cuda":
        known = catalog_peak(torch.cuda.get_device_name(device), precision)
        if known is not None:
            return known
    return Peak(measured_peak(device.type, precision), f"measured: {precision} matmul on this {device.type} rank")


def catalog_peak(device_name: str, precision: str) -> Peak | None:
    """The catalogue's dense peak of the GPU that ``device_name`` names ("NVIDIA H100 80GB HBM3"), else None."""
    known = [g for g in catalog()["gpus"] if g in device_name]
    if not known:
        return None
    gpu = max(known, key=len)  # the longest name it contains: "A100", never a shorter one inside it
    tflops = catalog()["gpus"][gpu].get(precision)
    return Peak(float(tflops) * 1e12, f"catalog: {gpu} {precision}") if tflops else None


@cache
def measured_peak(device_type: str, precision: str, n: int = 0, budget_s: float = 0.25) -> float:
    """The median FLOP/s of ``n x n`` matmuls at ``precision`` over about ``budget_s`` (cached per process).

    The rank's own threads run it, so on a CPU shared by ranks each rank measures the share it trains on. ``n``
    0 sizes it to the device: 1024 on a CPU; 8192 on a GPU, where a 1024 product is over in microseconds and its
    launch and sync would be timed instead (an H200 read 85 TFLOP/s at 1024, a twelfth of its datasheet 989).
    """
    device = torch.device(device_type)
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device).to(_DTYPES[precision])
    b = torch.randn(n, n, device=device).to(_DTYPES[precision])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rates: list[float] = []
    end = time.perf_counter() + budget_s
    torch.mm(a, b)  # warm-up: kernel choice, thread pool start
    while time.perf_counter() < end or len(rates) < 3:
        sync()  # a sync point: the benchmark runs before the first step, never inside one
        t0 = time.perf_counter()
        torch.mm(a, b)  # n=1024: 2.1 GFLOP, 30-70 ms on one core of this repository's CPU host
        sync()
        rates.append(2 * n ** 3 / (time.perf_counter() - t0))
    # The median, not the best: one sample can read far too fast on a shared host (seen: 10x on this CPU).
    return sorted(rates)[len(rates) // 2]
