"""Simulated slow storage: a per-sample read delay, for experiments on the input pipeline.

``data.sample_delay_ms`` makes every training sample cost that long to read. With scope ``node``
the machine has one simulated disk: reads of all its processes (and their loader workers) queue for
it, so the data time per step grows with the processes per node, as with one real slow disk
(data reading as the bottleneck). With scope ``process`` each process has its own disk (latency without contention).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from torch.utils.data import Dataset

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: every process gets its own disk
    fcntl = None  # type: ignore[assignment]

__all__ = ["SampleDelay", "with_sample_delay"]


def _job_key() -> str:
    """One key per job on this machine (torchrun's run id), so two jobs never share a simulated disk."""
    return os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("MASTER_PORT") or str(os.getpid())


class SampleDelay(Dataset):
    """Wrap a dataset so that reading ``n`` samples takes ``n x delay_ms`` (queued per node when shared)."""

    def __init__(self, dataset: Dataset, delay_ms: float, scope: str = "node"):
        self.dataset, self.delay_s = dataset, delay_ms / 1000.0
        self.shared = scope == "node" and fcntl is not None
        self.lock_path = Path(tempfile.gettempdir()) / f"trainscale-disk-{_job_key()}.lock"
        self._fd: int | None = None
        self._pid = -1
        self.labels = getattr(dataset, "labels", None)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def _read(self, n: int) -> None:
        if not self.shared:
            time.sleep(n * self.delay_s)
            return
        if self._pid != os.getpid():  # a forked loader worker must open its own file to hold its own lock
            self._fd, self._pid = os.open(self.lock_path, os.O_CREAT | os.O_RDWR, 0o600), os.getpid()
        assert self._fd is not None  # opened above in this process
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            time.sleep(n * self.delay_s)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def __getitem__(self, i: int):
        self._read(1)
        return self.dataset[i]

    def __getitems__(self, idx: list[int]):
        self._read(len(idx))
        if hasattr(self.dataset, "__getitems__"):
            return self.dataset.__getitems__(idx)
        return [self.dataset[i] for i in idx]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fd"], state["_pid"] = None, -1  # spawned workers open their own
        return state


def with_sample_delay(dataset: Dataset, delay_ms: float, scope: str = "node") -> Dataset:
    """``dataset`` itself when there is no delay, else wrapped in :class:`SampleDelay`."""
    return SampleDelay(dataset, delay_ms, scope) if delay_ms > 0 else dataset
