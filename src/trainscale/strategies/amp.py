"""Mixed precision: autocast for the forward pass, a dynamic loss scaler for fp16."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from ..config import ConfigError

__all__ = ["apply_amp", "check_amp"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_amp(amp: str, device: torch.device) -> None:
    """Refuse fp16 off CUDA: its loss scaling and kernels are a GPU path."""
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError("strategy.amp", amp, "fp16 needs a CUDA device; on CPU use bf16 or none")


def apply_amp(amp: str, device: torch.device) -> tuple[Callable[[], AbstractContextManager], torch.amp.GradScaler]:
    """Return (autocast context factory, loss scaler); the scaler is a no-op unless amp is fp16."""
    check_amp(amp, device)
    scaler = torch.amp.GradScaler(device.type, enabled=(amp == "fp16"))
    if amp == "none":
        return contextlib.nullcontext, scaler
    dtype = _DTYPES[amp]
    return (lambda: torch.autocast(device.type, dtype=dtype)), scaler
