"""Writing a run summary: atomically, as strict JSON (NaN and infinities as null, which the reader restores)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..reporting.files import atomic_write_bytes

__all__ = ["write_summary", "strict_json"]


def strict_json(value: Any) -> Any:
    """``value`` with every NaN and infinity replaced by None, so strict JSON parsers accept it (null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def write_summary(path: str | Path, summary: dict[str, Any]) -> None:
    """Write the summary atomically (never a half-written JSON); NaN and infinities as null."""
    text = json.dumps(strict_json(summary), indent=2, default=str, allow_nan=False) + "\n"
    atomic_write_bytes(path, lambda f: f.write(text.encode()))
