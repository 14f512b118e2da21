"""Host syncs per step on a GPU: each time the host waits for the device's queue to drain (``.item()``,
``.cpu()``, a tensor in an ``if``, ``nonzero``), counted with PyTorch's own sync debug mode.

``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronizing CUDA call raise one warning; the counter
takes those warnings (and only those) off the user's stderr and counts them, each by the line of the script that
made it (the warning's frame), so that the report can point at it. On CPU nothing is counted: there is no device
queue, so reading a tensor's value waits for nothing.
"""

from __future__ import annotations

import linecache
import os
import warnings
from collections import Counter
from typing import Any

from ..about import PACKAGE_DIR

__all__ = ["SyncCounter", "NOT_ON_CPU"]

NOT_ON_CPU = ("not measured on CPU: a host sync waits for a device's queue, and on CPU there is none (count it on a "
              "GPU)")
_MESSAGE = "called a synchronizing CUDA operation"


class SyncCounter:
    """Counts synchronizing CUDA calls since the last ``take``; ``start`` returns the measurement's status."""

    def __init__(self) -> None:
        self.count = 0
        self.sites: Counter[tuple[str, int]] = Counter()  # (file, line) of each sync, the run's whole count
        self._show: Any = None

    def start(self, torch: Any, device_type: str) -> str:
        """Turn the counting on for ``device_type`` (only "cuda" is counted)."""
        if device_type != "cuda":
            return NOT_ON_CPU if device_type == "cpu" else f"not measured on {device_type}"
        if not hasattr(torch.cuda, "set_sync_debug_mode"):
            return "not measured: no torch.cuda.set_sync_debug_mode in this PyTorch"
        self.listen()
        torch.cuda.set_sync_debug_mode("warn")
        return "measured"

    def listen(self) -> None:
        """Take every sync warning (each one, not once per call site) off stderr into the count."""
        warnings.filterwarnings("always", message=f".*{_MESSAGE}")
        self._show = warnings.showwarning
        warnings.showwarning = self._seen

    def _seen(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None,
              line: Any = None) -> None:
        if _MESSAGE in str(message):
            if not os.path.abspath(filename).startswith(PACKAGE_DIR):  # trainscale's own syncs (its timers)
                self.count += 1
                self.sites[(filename, lineno)] += 1
            return
        self._show(message, category, filename, lineno, file, line)

    def take(self) -> int:
        """The syncs counted since the last call."""
        n, self.count = self.count, 0
        return n

    def top_sites(self, steps: int, keep: int = 3) -> list[dict[str, Any]]:
        """The lines that synced most: ``where`` (file:line), the ``code`` there and its syncs ``per_step``."""
        return [{"where": f"{os.path.basename(f)}:{n}", "code": linecache.getline(f, n).strip(),
                 "per_step": round(c / max(1, steps), 2)} for (f, n), c in self.sites.most_common(keep)]
