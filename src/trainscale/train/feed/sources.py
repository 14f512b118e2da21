"""A user's own batches as the run's loader: a function that returns a batch, or an iterable of batches.

nanoGPT's ``get_batch`` draws random windows of a memory-mapped token file; a streaming job hands over an
``IterableDataset`` (or a ``DataLoader`` over one, or a generator). Neither has indices to shard, so the user
decides what each rank reads: seed the function from ``run.env.rank``, or let the iterable yield this rank's
share. The run calls the source in the training thread (a function drawing from torch's global generator keeps
its sequence), moves each batch to the device, and times the call as the step's data wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeGuard

from torch.utils.data import DataLoader, IterableDataset

from ...data.loader import batch_len, move_to
from ..errors import RunError

__all__ = ["BatchSource", "is_batch_source"]


def _is_function(data: Any) -> TypeGuard[Callable[[], Any]]:
    """A batch function (nanoGPT's ``get_batch``): callable, and not a dataset or a loader."""
    return callable(data) and not isinstance(data, (DataLoader, IterableDataset)) and not hasattr(data, "__getitem__")


def is_batch_source(data: Any) -> bool:
    """A function, an IterableDataset (or a DataLoader over one) or an iterator: batches without indices."""
    if isinstance(data, DataLoader):
        return isinstance(data.dataset, IterableDataset)
    iterator = hasattr(data, "__next__") and not hasattr(data, "state_dict")  # a ready loader has a state
    return isinstance(data, IterableDataset) or _is_function(data) or iterator


class BatchSource:
    """The run's loader over a user's batch function or iterable: this rank's batches, on the device.

    An iterable starts again when it ends (an epoch); a resumed run skips the batches it had already taken, so
    an iterable that yields the same batches each time it starts resumes exactly. A function, an iterator or a
    generator is not replayed: one that should resume exactly draws from a generator seeded with
    ``run.step_count``.

    Example::

        def get_batch():                       # nanoGPT's: random windows of this rank's token file
            i = torch.randint(len(data) - block, (batch_size,), generator=g)
            return torch.stack([data[j:j + block] for j in i]), torch.stack([data[j + 1:j + 1 + block] for j in i])

        for x, y in run.batches(get_batch, steps=1000):
            ...
    """

    def __init__(self, source: Callable[[], Any] | Iterable[Any], device: Any):
        self.device = device
        self.fn = source if _is_function(source) else None
        self.iterable = None if self.fn is not None else source
        self.one_shot = hasattr(source, "__next__")  # an iterator or a generator: it cannot start again
        self._it: Iterator[Any] | None = None
        self.taken, self._skip = 0, 0
        self._in_pass = 0  # batches drawn from the iterable since it last started
        self.skipped = 0  # the run summary's unreadable-sample count: a user's source reports none
        self._busy_s, self._samples = 0.0, 0
        self._peeked = [self._draw()]  # the first batch sets the batch size the summary's global batch counts
        self.batch_size = batch_len(self._peeked[0]) or None

    @property
    def batches_per_epoch(self) -> int:
        """Batches per pass of a sized iterable; a function or an unsized iterable has no epoch."""
        n = len(self.iterable) if self.iterable is not None and hasattr(self.iterable, "__len__") else 0  # type: ignore[arg-type]
        if not n:
            kind = "a batch function" if self.fn is not None else "an iterable without a length"
            raise RunError(f"run.batches over {kind} needs steps=N: it has no epoch to end")
        return n

    def _draw(self) -> Any:
        t0 = time.perf_counter()
        if self.fn is not None:
            batch = self.fn()
        else:
            batch = self._next_of_iterable()
        batch = move_to(batch, self.device)
        self._busy_s += time.perf_counter() - t0
        self._samples += batch_len(batch)
        return batch

    def _next_of_iterable(self) -> Any:
        for _ in range(2):  # at most one restart per batch: an empty iterable must not spin
            if self._it is None:
                self._it = iter(self.iterable)  # type: ignore[arg-type]
                for _ in range(self._skip):  # a resumed run: the batches of this pass taken before the checkpoint
                    next(self._it, None)
                self._in_pass, self._skip = self._skip, 0
            try:
                batch = next(self._it)
                self._in_pass += 1
                return batch
            except StopIteration:
                self._it, self._in_pass = None, 0
                if self.one_shot:
                    raise RunError("run.batches: the batch iterator ran out; pass a re-iterable "
                                   "(an IterableDataset or a DataLoader) or fewer steps") from None
        raise RunError("run.batches: the batch iterable yielded nothing")

    def __iter__(self) -> BatchSource:
        return self

    def __next__(self) -> Any:
        self.taken += 1
        return self._peeked.pop() if self._peeked else self._draw()

    @property
    def samples_per_s(self) -> float:
        """Samples the source delivered per second of its own time (its rate when nothing waits on it)."""
        return self._samples / self._busy_s if self._busy_s > 0 else float("nan")

    def state_dict(self) -> dict[str, int]:
        """Batches taken, and how far into the iterable's current pass (a batch drawn ahead is not taken)."""
        return {"taken": self.taken, "in_pass": max(0, self._in_pass - len(self._peeked))}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume: an iterable starts its pass again and skips what was taken of it; a function goes on."""
        self.taken = int(state.get("taken", 0))
        if self.iterable is not None and not self.one_shot:
            self._it, self._peeked, self._skip = None, [], int(state.get("in_pass", 0))

    def close(self) -> None:
        self._it = None
