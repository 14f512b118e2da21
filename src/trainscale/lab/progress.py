"""The lab's progress: a rich bar on a terminal; in a log or a pipe (a batch job's output), one line per run done."""

from __future__ import annotations

import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from ..reporting.console import err_console

__all__ = ["LabProgress"]


class LabProgress(Progress):
    """The runs of one lab command (``doctor``, ``bench``), counted.

    On a terminal, rich's bar (erased at the end). Elsewhere rich draws nothing, so a job's log would stay silent
    for the minutes the runs take: then each run that ends prints one line, with the runs done, the time so far
    and the run that starts next. Nothing is printed before the first run ends, so input refused at the start
    stays the command's one line.

    Example::

        with LabProgress("doctor") as bar:
            task = bar.add_task("", total=4)
            bar.update(task, description="base at 2 process(es), run 1")
            ...  # the run
            bar.advance(task)
    """

    def __init__(self, label: str):
        super().__init__(TextColumn(f"{label} {{task.description}}"), BarColumn(), MofNCompleteColumn(),
                         TimeElapsedColumn(), console=err_console, transient=True)
        self.label, self.lines, self.t0 = label, not err_console.is_terminal, time.perf_counter()
        self._done: str | None = None  # the run that just ended, said with the next one's start

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        description = kwargs.get("description")
        if self.lines and description and self._done is not None:
            self._say(task_id, f"{self._done}; next: {description}")
            self._done = None

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        """A run ended: said once the next starts (or at the end, if none does)."""
        self._flush(task_id)
        self._done = str(self._task(task_id).description) + " done"
        super().advance(task_id, advance)

    def stop(self) -> None:
        if self.tasks:
            self._flush(self.tasks[0].id)
        super().stop()

    def _task(self, task_id: TaskID) -> Any:
        return next(t for t in self.tasks if t.id == task_id)

    def _flush(self, task_id: TaskID) -> None:
        if self.lines and self._done is not None:
            self._say(task_id, self._done)
        self._done = None

    def _say(self, task_id: TaskID, what: str) -> None:
        task = self._task(task_id)
        total = f"/{task.total:g}" if task.total is not None else ""
        err_console.print(f"{self.label}: {task.completed:g}{total} runs, {time.perf_counter() - self.t0:.0f} s: "
                          f"{what}", highlight=False, soft_wrap=True)
