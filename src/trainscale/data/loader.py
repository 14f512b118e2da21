"""Loaders: samples stay uint8 until they reach the device, where they are cast and normalised.

The training pipeline, per rank::

    EpochBatchSampler (endless)  ->  DataLoader workers (decode/crop, uint8, pinned on CUDA)
        ->  Prefetcher thread (copy to the device on a side stream + normalise; data.prefetch deep)
        ->  TrainLoader.__next__ (the compute stream waits on the copy's event)

The position saved in a checkpoint is that of the batches the step CONSUMED, not those produced
ahead by the workers or the prefetcher, so a resumed run gets the same next batch.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from ..config import ConfigError
from ..log import logger
from .datasets import DataInfo
from .sampler import BatchKey, EpochBatchSampler, ShardedSampler, eval_indices

__all__ = ["DeviceNormalize", "ToDevice", "TrainLoader", "Prefetcher", "eval_batches", "batch_len", "move_to",
           "PREFETCH_THREAD"]

PREFETCH_THREAD = "trainscale-prefetch"  # the per-rank accounting counts this thread as the loader's


def _collate(batch: Any) -> Any:
    if isinstance(batch, tuple) and len(batch) == 2 and torch.is_tensor(batch[0]):
        return batch
    return default_collate(batch)


def _identity(batch: Any) -> Any:
    return batch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a batch of any structure (tensor, tuple/list, dict, nested)."""
    if torch.is_tensor(batch):
        yield batch
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from _tensors(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            yield from _tensors(v)


def batch_len(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (0 when it holds none)."""
    t = next(_tensors(batch), None)
    return int(t.shape[0]) if t is not None and t.dim() else 0


def move_to(batch: Any, device: torch.device) -> Any:
    """The same structure with every tensor on ``device`` (asynchronous from pinned memory on CUDA)."""
    nb = device.type == "cuda"
    if torch.is_tensor(batch):
        return batch.to(device, non_blocking=nb)
    if isinstance(batch, dict):
        return {k: move_to(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(move_to(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(v, device) for v in batch)
    return batch


class ToDevice:
    """A user's batch, of any structure, moved to the device as it is (their loss decides dtypes)."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, batch: Any) -> Any:
        return move_to(batch, self.device)


def _worker_init(_: int) -> None:
    # OpenCV starts a thread pool per process; in a worker it would fight the other workers for cores.
    cv2 = sys.modules.get("cv2")
    if cv2 is not None:
        cv2.setNumThreads(1)


class DeviceNormalize:
    """Move a batch to the device, then cast and normalise there (uint8 travels, 4x less than float32)."""

    def __init__(self, info: DataInfo, device: torch.device, dtype: torch.dtype = torch.float32):
        c = len(info.mean)
        self.device, self.dtype = device, dtype
        self.mean = torch.tensor(info.mean, device=device).view(1, c, 1, 1)
        self.inv_std = 1.0 / torch.tensor(info.std, device=device).view(1, c, 1, 1)

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch[0], batch[1]
        nb = self.device.type == "cuda"
        x, y = x.to(self.device, non_blocking=nb), y.to(self.device, non_blocking=nb)
        if x.dtype == torch.uint8:
            # In place on the fresh float copy: one allocation, no temporaries (this runs per batch).
            x = x.float().sub_(self.mean).mul_(self.inv_std).to(self.dtype)
        return x, y


class _KeyedDataset(Dataset):
    """Turns a ``BatchKey`` into ``(x, y, errors, epoch, batch)`` in whichever process reads it."""

    def __init__(self, dataset: Dataset, seed: int, collate: Callable | None = None):
        self.dataset, self.seed, self.collate = dataset, seed, collate

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitems__(self, key: BatchKey) -> tuple[Any, ...]:
        ds, (epoch, k, idx) = self.dataset, key
        errors: list = []
        if hasattr(ds, "get_batch"):  # epoch-aware datasets draw their augmentation per (seed, epoch, sample)
            x, y, errors = ds.get_batch(idx, epoch, self.seed)
            batch: Any = (x, y)
        elif hasattr(ds, "__getitems__") and self.collate is None:
            batch = _collate(ds.__getitems__(idx))
        else:
            batch = (self.collate or default_collate)([ds[i] for i in idx])
        return batch, errors, epoch, k


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


class Prefetcher:
    """Keeps ``depth`` processed batches ready, produced by a background thread from ``source``.

    ``stage`` (the copy to the device and the normalisation) runs in that thread; on CUDA inside a
    side stream, and the consumer's stream waits on an event recorded after it, so the copy of batch
    i+1 overlaps the compute of batch i (double buffering). ``depth`` 0: everything in ``get``.
    ``busy_s`` and ``samples`` count the producer's own work, not its waits on a full queue, so
    ``samples / busy_s`` is what the input pipeline alone could deliver.
    """

    def __init__(self, source: Iterator, stage: Callable | None, depth: int, device: torch.device):
        self.source, self.stage, self.depth = source, stage, depth
        self.cuda = device.type == "cuda" and stage is not None
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.busy_s, self.samples, self._warm = 0.0, 0, False
        self._stop = threading.Event()
        self._q: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._thread = threading.Thread(target=self._run, name=PREFETCH_THREAD, daemon=True)
            self._thread.start()

    def _produce(self) -> tuple[Any, ...]:
        t0 = time.perf_counter()
        batch, errors, epoch, k = next(self.source)
        event = None
        if self.stage is not None:
            with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
                batch = self.stage(batch)
                if self.cuda:
                    event = torch.cuda.Event()
                    event.record(self.stream)
        if self._warm:  # the first batch also pays for starting the workers: not the pipeline's rate
            self.busy_s += time.perf_counter() - t0
            self.samples += batch_len(batch)
        self._warm = True
        return batch, errors, epoch, k, event

    def _run(self) -> None:
        item: Any = None
        while not self._stop.is_set():
            try:
                item = self._produce()
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
                item = _Failure(e)
            while not self._stop.is_set():
                try:
                    self._q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failure):
                return

    def get(self) -> tuple[Any, ...]:
        """The next ``(batch, errors, epoch, batch index)``; ready to use on the consumer's stream."""
        if self._thread is None:
            item = self._produce()
        else:
            item = self._q.get()
        if isinstance(item, _Failure):
            raise item.exc
        batch, errors, epoch, k, event = item
        if event is not None:
            cur = torch.cuda.current_stream()
            cur.wait_event(event)
            # Memory made on the side stream is now used on this one; tell the caching allocator.
            for t in _tensors(batch):
                t.record_stream(cur)
        return batch, errors, epoch, k

    def close(self) -> None:
        """Stop the thread and the workers behind ``source``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        shutdown = getattr(self.source, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self.source = iter(())


class TrainLoader:
    """Endless device batches over epochs, with a position that checkpoints can save and restore.

    Example::

        loader = TrainLoader(ds, info, torch.device("cpu"), batch_size=64, workers=2, prefetch=2)
        x, y = next(loader)           # float32, normalised, on the device
        state = loader.state_dict()   # {"epoch": 0, "batch_in_epoch": 1}
    """

    def __init__(self, dataset: Dataset, info: DataInfo | None, device: torch.device, batch_size: int,
                 rank: int = 0, world: int = 1, workers: int = 0, shuffle: bool = True, seed: int = 0,
                 prefetch: int = 2, on_error: str = "skip", dtype: torch.dtype = torch.float32,
                 collate: Callable | None = None):
        self.dataset, self.batch_size, self.workers, self.seed = dataset, batch_size, workers, seed
        self.prefetch, self.on_error, self.device, self.collate = prefetch, on_error, device, collate
        self.sampler = ShardedSampler(len(dataset), rank, world, shuffle, seed)  # type: ignore[arg-type]
        # Built-in image data (info given): uint8 travels, normalised on the device. A user's batch: moved as is.
        self.to_device: Callable = DeviceNormalize(info, device, dtype) if info is not None else ToDevice(device)
        self.pin = device.type == "cuda"
        self.epoch, self.batch_in_epoch = 0, 0
        self.skipped = 0
        self.workers_started = 0  # how many times worker processes were started (1 for a whole run)
        self._pipe: Prefetcher | None = None
        self._device_stage = True
        self._busy_s, self._samples = 0.0, 0

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.sampler.per_rank // self.batch_size)

    def _start(self, device_stage: bool) -> None:
        self._close_pipe()
        batches = EpochBatchSampler(self.sampler, self.batch_size, self.epoch, self.batch_in_epoch)
        # DataLoader hands each BatchKey whole to _KeyedDataset.__getitems__; its annotation expects index lists.
        keys = cast(Iterable[list[Any]], batches)
        dl = DataLoader(_KeyedDataset(self.dataset, self.seed, self.collate), batch_sampler=keys, num_workers=self.workers,
                        collate_fn=_identity, pin_memory=self.pin, worker_init_fn=_worker_init,
                        prefetch_factor=2 if self.workers else None)
        source = iter(dl)  # workers fork here, in the training thread, never from the prefetch thread
        self.workers_started += 1 if self.workers else 0
        self._pipe = Prefetcher(source, self.to_device if device_stage else None, self.prefetch, self.device)
        self._device_stage = device_stage

    def _take(self, device_stage: bool) -> Any:
        if self._pipe is None or self._device_stage != device_stage:
            self._start(device_stage)
        while True:
            batch, errors, epoch, k = self._pipe.get()  # type: ignore[union-attr]
            self.epoch, self.batch_in_epoch = epoch, k + 1
            if self.batch_in_epoch == self.batches_per_epoch:
                self.epoch, self.batch_in_epoch = epoch + 1, 0
            if errors:
                self._report(errors)
            if batch_len(batch):  # a batch whose every image was unreadable is passed over
                return batch

    def _report(self, errors: list[tuple[str, str, bool]]) -> None:
        for file, why, fatal in errors:
            if fatal:
                self.close()
                raise ConfigError("data.path", file, why)
            if self.on_error == "raise":
                self.close()
                raise ConfigError("data.path", file, f"unreadable image ({why}); "
                                                     "data.on_error = skip leaves such files out with a warning")
            self.skipped += 1
            logger.warning(f"skipped unreadable image {file}: {why} ({self.skipped} so far; data.on_error = skip)")

    def __iter__(self) -> TrainLoader:
        return self

    def next_host(self) -> Any:
        """The next batch as the workers produced it (still on the host, still uint8)."""
        return self._take(False)

    def __next__(self) -> Any:
        return self._take(True)

    @property
    def samples_per_s(self) -> float:
        """What the input pipeline alone delivered per second of its own work (rate when nothing waits on it)."""
        busy = self._busy_s + (self._pipe.busy_s if self._pipe else 0.0)
        n = self._samples + (self._pipe.samples if self._pipe else 0)
        return n / busy if busy > 0 else float("nan")

    def state_dict(self) -> dict[str, int]:
        """Where the next CONSUMED batch comes from: epoch and batches already taken in it."""
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved position (batches produced ahead of it are dropped)."""
        self._close_pipe()
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        if self.batch_in_epoch >= self.batches_per_epoch:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    def _close_pipe(self) -> None:
        if self._pipe is not None:
            self._busy_s += self._pipe.busy_s
            self._samples += self._pipe.samples
            self._pipe.close()
            self._pipe = None

    def close(self) -> None:
        """Stop the prefetch thread and the worker processes (a later ``next`` starts them again)."""
        self._close_pipe()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._close_pipe()


def eval_batches(dataset: Dataset, info: DataInfo, device: torch.device, batch_size: int, rank: int, world: int,
                 ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's evaluation batches, on the device; shards are uneven, no sample is repeated."""
    idx = eval_indices(len(dataset), rank, world)  # type: ignore[arg-type]
    to_device = DeviceNormalize(info, device)
    for i in range(0, len(idx), batch_size):
        yield to_device(_collate(dataset.__getitems__(idx[i:i + batch_size]) if hasattr(dataset, "__getitems__")
                                 else [dataset[j] for j in idx[i:i + batch_size]]))
