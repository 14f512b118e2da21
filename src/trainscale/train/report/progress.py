"""Progress on rank 0: a rich bar on a terminal, a plain line every log interval otherwise."""

from __future__ import annotations

import sys
import time

from ...log import logger

__all__ = ["ProgressView"]


class ProgressView:
    """Shows step, loss and throughput; silent on ranks other than 0."""

    def __init__(self, total: int, mode: str, enabled: bool, start: int = 0):
        self.enabled, self.total = enabled, total
        self.bar = None
        if enabled and (mode == "bar" or (mode == "auto" and sys.stderr.isatty())):
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                                TimeRemainingColumn(), transient=False)
            self.task = self.bar.add_task("train", total=total, completed=start, info="")
            self.bar.start()
        self.lines = enabled and self.bar is None and mode != "none"
        self.t0 = time.perf_counter()

    def update(self, step: int, loss: float, samples_per_s: float) -> None:
        """Called at log points only (after the metrics were fetched from the device)."""
        info = f"loss {loss:.4f}  {samples_per_s:,.0f} samples/s"
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=info)
        elif self.lines:
            logger.info(f"step {step}/{self.total}  {info}  ({time.perf_counter() - self.t0:.1f}s)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
