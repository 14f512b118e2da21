"""Peak memory of this rank while it trains: the device allocator's on CUDA, the process's resident set on CPU.

On CUDA it is ``torch.cuda.max_memory_allocated`` (tensors only, the caching allocator's reserve excluded),
since ``reset``. On CPU torch keeps no allocator statistics, so it is the process's resident-set high-water mark
(``VmHWM`` of ``/proc/self/status``), reset by writing 5 to ``/proc/self/clear_refs`` (Linux >= 4.0): every byte
the process holds at its fullest moment since ``reset``, the Python and torch runtime (a few hundred MB) included.
Where the reset is refused, the high-water mark covers the whole process life, and ``measure`` says so.
The resident set also holds what malloc keeps after tensors are freed (glibc raises its mmap threshold to the
largest block freed and keeps later blocks of that size on its heap), so a strategy that allocates and frees
large buffers every layer (FSDP's gathered units) shows more than its live tensors; with
``MALLOC_MMAP_THRESHOLD_=131072`` in the environment the resident set follows the live tensors.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

__all__ = ["PeakMemory"]

_CLEAR = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _vm_hwm() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakMemory:
    """This rank's peak memory since ``reset`` and how it was measured.

    Example::

        mem = PeakMemory(device); mem.reset()   # after the model, its shards and the optimizer exist
        ...                                     # training steps
        mem.peak(), mem.measure
    """

    __slots__ = ("device", "measure")

    def __init__(self, device: torch.device):
        self.device = device
        self.measure = "cuda max_memory_allocated" if device.type == "cuda" else "cpu peak resident set (VmHWM)"

    def reset(self) -> None:
        """Start the peak from now (no host-device sync: the allocator's counters are host-side)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            _CLEAR.write_text("5")
            self.measure = "cpu peak resident set since prepare (VmHWM after clear_refs)"
        except OSError:
            self.measure = "cpu peak resident set of the process's life (ru_maxrss; clear_refs refused)"

    def peak(self) -> int:
        """Bytes at this rank's fullest moment since ``reset``."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        hwm = _vm_hwm()
        if hwm is not None:
            return hwm
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if sys.platform == "darwin" else rss * 1024)  # macOS counts bytes, Linux KiB
