"""Which framework drives the script's loop, and its version: read once, from the modules on the call stack
of the first optimizer step (``import lightning`` alone loads both Fabric and the Trainer; the stack tells which
one stepped)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["framework_on_stack"]

# A module prefix on the optimizer step's stack -> (name, distribution); most specific first.
_DRIVERS = (("transformers.", "Hugging Face Trainer", "transformers"),
            ("lightning.pytorch.", "Lightning Trainer", "lightning"),
            ("pytorch_lightning.", "Lightning Trainer", "pytorch_lightning"),
            ("lightning.fabric.", "Lightning Fabric", "lightning"),
            ("lightning_fabric.", "Lightning Fabric", "lightning_fabric"),
            ("accelerate.", "accelerate", "accelerate"))


def framework_on_stack(depth: int = 64) -> dict[str, Any]:
    """``{"name", "version"}`` of the framework whose code called the optimizer step (plain PyTorch if none)."""
    names: list[str] = []
    frame = sys._getframe(1)
    while frame is not None and len(names) < depth:
        names.append(str(frame.f_globals.get("__name__", "")))
        frame = frame.f_back  # type: ignore[assignment]
    for prefix, name, dist in _DRIVERS:
        if any(n.startswith(prefix) for n in names):
            return {"name": name, "version": getattr(sys.modules.get(dist), "__version__", None)}
    import torch

    return {"name": "PyTorch", "version": torch.__version__}
