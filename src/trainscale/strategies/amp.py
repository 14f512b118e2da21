"""Mixed precision: autocast for the forward pass, a dynamic loss scaler for fp16."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from ..config import ConfigError

__all__ = ["apply_amp", "check_amp"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_amp(amp: str, device: torch.device) -> None:
    """Refuse a precision this PyTorch cannot autocast to on ``device`` (it would silently run in float32)."""
    if amp == "none":
        return
    with warnings.catch_warnings():  # an unsupported dtype warns and disables itself: this says it as an error
        warnings.simplefilter("ignore")
        with torch.autocast(device.type, dtype=_DTYPES[amp]):
            enabled = torch.is_autocast_enabled(device.type)
    if not enabled:
        raise ConfigError("strategy.amp", amp, f"this PyTorch ({torch.__version__}) has no {amp} autocast on "
                                               f"{device.type}; use bf16 or none")


def apply_amp(amp: str, device: torch.device) -> tuple[Callable[[], AbstractContextManager], torch.amp.GradScaler]:
    """Return (autocast context factory, loss scaler); the scaler is a no-op unless amp is fp16."""
    check_amp(amp, device)
    scaler = torch.amp.GradScaler(device.type, enabled=(amp == "fp16"))
    if amp == "none":
        return contextlib.nullcontext, scaler
    dtype = _DTYPES[amp]
    return (lambda: torch.autocast(device.type, dtype=dtype)), scaler
