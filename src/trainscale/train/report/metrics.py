"""Live metrics: rank 0 appends one JSON line per log point to ``metrics.jsonl``, and feeds ``log.tracker``.

Each line is flushed as it is written, so a run that crashes or is killed keeps its curve up to its
last log point. The values are those of the log point's window (the steps since the previous point).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, TextIO

from ...log import logger
from .trackers import Tracker, open_tracker

__all__ = ["MetricsLog"]


class MetricsLog:
    """``metrics.jsonl`` in ``folder`` (None: no file) and the chosen tracker."""

    def __init__(self, folder: Path | None, tracker: str, tracker_folder: Path | str, config: dict[str, Any],
                 run_name: str = ""):
        self.path = folder / "metrics.jsonl" if folder is not None else None
        self.written: Path | None = None  # the file, once a point went into it
        self.append = False  # a resumed run continues its file (set by run.load before the first point)
        self._file: TextIO | None = None
        # Opened here, before the first step: importing a tracker takes seconds that are no step's time.
        self.tracker: Tracker | None = open_tracker(tracker, tracker_folder, config, run_name)

    def log(self, step: int, values: dict[str, float], file_only: dict[str, Any] | None = None) -> None:
        """One log point: a flushed line, then the tracker (``file_only``: fields for the line alone)."""
        if self._file is None and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a" if self.append else "w", encoding="utf-8")
            self.written = self.path
        if self._file is not None:
            row = {"step": step, "time": round(time.time(), 3),
                   **{k: (v if math.isfinite(v) else None) for k, v in values.items()}, **(file_only or {})}
            self._file.write(json.dumps(row, allow_nan=False) + "\n")
            self._file.flush()  # in the OS's hands now: a killed process keeps the line (no fsync: it can stall)
        if self.tracker is not None:
            try:
                self.tracker.log(step, values)
            except Exception as e:  # a tracker's failure must not end a training run
                logger.warning(f"log.tracker: {type(e).__name__}: {e}; no more points sent to it")
                self.tracker = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.path = None  # closed for good: a late point must not reopen (and truncate) the file
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
