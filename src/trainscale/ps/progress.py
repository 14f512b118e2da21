"""Progress of a parameter-server run: a rich bar on a terminal, one timeline line per update otherwise."""

from __future__ import annotations

import sys
import time

from ..log import logger

__all__ = ["PsProgress"]


class PsProgress:
    """``mode``: auto (bar on a terminal), bar, lines (a line every ``every`` updates) or none."""

    def __init__(self, total: int | None, mode: str = "auto", every: int = 1, label: str = "ps"):
        self.total, self.every, self.bar = total, max(1, every), None
        if mode == "bar" or (mode == "auto" and sys.stderr.isatty()):
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                                TimeElapsedColumn(), transient=False)
            self.task = self.bar.add_task(label, total=total, info="")
            self.bar.start()
        self.lines = self.bar is None and mode != "none"
        self.t0 = time.perf_counter()

    def update(self, update: int, info: str) -> None:
        """Show update ``update`` with a short description (learners, staleness, loss)."""
        if self.bar is not None:
            self.bar.update(self.task, completed=update, info=info)
        elif self.lines and update % self.every == 0:
            total = f"/{self.total}" if self.total else ""
            logger.info(f"update {update}{total}  {info}  ({time.perf_counter() - self.t0:.2f}s)")

    def close(self) -> None:
        """Stop the bar (idempotent)."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
