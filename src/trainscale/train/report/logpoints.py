"""What a run shows and records at each log point: the progress line, metrics.jsonl and the tracker."""

from __future__ import annotations

from pathlib import Path

from ...config import Config, config_to_dict
from .metrics import MetricsLog
from .progress import ProgressView

__all__ = ["LogPoints"]


class LogPoints:
    """The live view of a run (rank 0 writes; every rank keeps the progress line's state).

    Example::

        points = LogPoints(cfg, is_main, run_dir, out_dir)
        points.start(total_steps, start_step)
        points.log(step, {"loss": 2.1, "steps": 20, "window_s": 0.4, "time_s": 3.0}, global_batch, wait_s)
    """

    def __init__(self, cfg: Config, is_main: bool, run_dir: Path | None, out_dir: Path):
        self.cfg, self.is_main, self.run_dir, self.out_dir = cfg, is_main, run_dir, out_dir
        self.view: ProgressView | None = None
        self._metrics: MetricsLog | None = None
        self.flops: tuple[float, float] | None = None  # (the job's FLOPs per optimizer step, its peak FLOP/s)

    def set_flops(self, per_step: float, peak: float) -> None:
        """The job's model FLOPs per optimizer step and peak FLOP/s: from here each row carries MFU."""
        self.flops = (per_step, peak)

    def open(self) -> MetricsLog:
        """The metrics file and tracker (their import and set-up happen before the first timed step)."""
        if self._metrics is None:
            log = self.cfg.log
            self._metrics = MetricsLog(self.run_dir if log.metrics else None, log.tracker,
                                       log.tracker_dir or self.out_dir, config_to_dict(self.cfg),
                                       run_name=log.run_name)
        return self._metrics

    def start(self, total: int, start_step: int) -> bool:
        """The loop starts; False when it had started already (a second ``run.batches`` call)."""
        if self.view is not None:
            return False
        self.view = ProgressView(total, self.cfg.log.progress, self.is_main, start=start_step)
        return True

    def resumed(self) -> None:
        """A resumed run continues its interrupted run's metrics.jsonl."""
        if self._metrics is not None:
            self._metrics.append = True

    def log(self, step: int, point: dict[str, float], global_batch: int, wait_s: float,
            straggler_scores: list[float] | None = None) -> None:
        """One log point: the loss window's figures as the progress line and a metrics row (with each rank's
        straggler score, its own time over the other ranks' median, in the file only)."""
        rate = point["steps"] * global_batch / point["window_s"]
        if self.view is not None:
            self.view.update(step, point["loss"], rate)
        if self.is_main:
            step_s = point["window_s"] / point["steps"]
            row = {"loss": point["loss"], "samples_per_s": rate, "step_time_s": step_s,
                   "data_wait_s": wait_s / point["steps"], "time_s": point["time_s"]}
            if self.flops is not None:
                row["mfu"] = self.flops[0] / step_s / self.flops[1]
            self.open().log(step, row, {"straggler_scores": straggler_scores} if straggler_scores else None)

    @property
    def written(self) -> str | None:
        """The metrics.jsonl written, if any."""
        return str(self._metrics.written) if self._metrics is not None and self._metrics.written else None

    def close_view(self) -> None:
        """The progress line ends (after the last step)."""
        if self.view is not None:
            self.view.close()

    def close(self) -> None:
        """The metrics file and tracker are flushed and closed."""
        if self._metrics is not None:
            self._metrics.close()
