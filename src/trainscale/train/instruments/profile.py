"""``--profile``: torch.profiler over the measured steps of every rank.

Rank 0 writes ``profile_rank0.txt`` (the profiler's own table) and ``profile_rank0.json`` (per-step seconds
per operator) into the run's folder; the doctor compares these files between world sizes. Every rank
writes its Chrome trace, ``traces/trace_rankN.json``, with one ``ProfilerStep#N`` span per step (Perfetto,
chrome://tracing; Holistic Trace Analysis reads the folder: ``TraceAnalysis(trace_dir=".../traces")``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from ...log import logger
from .protocol import Instrument, StepEnd

__all__ = ["OpProfiler", "MAX_PROFILED_STEPS"]

MAX_PROFILED_STEPS = 50  # enough for stable per-op medians; more only grows the trace in memory


class OpProfiler(Instrument):
    """Profile a window of steps; ``write`` leaves the table and its JSON in ``folder``.

    As a run's instrument (``log.profile``) it starts at the end of step ``warm`` (``start`` it first when that is 0)
    and writes into ``out_dir`` when the run finishes.
    """

    def __init__(self, device: torch.device, rank: int = 0, warm: int = 0, out_dir: Path | None = None):
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with warnings.catch_warnings():  # "won't be using warmup": the run's skip_first steps were the warm-up
            warnings.simplefilter("ignore")
            # A schedule, only so that each step is recorded as a ProfilerStep#N span (HTA's unit of analysis);
            # it stays active past MAX_PROFILED_STEPS, where ``step_done`` stops the profiler itself.
            steps = schedule(wait=0, warmup=0, active=MAX_PROFILED_STEPS + 1, repeat=1)
        self.prof = profile(activities=acts, record_shapes=False, schedule=steps)
        self.device, self.rank, self.steps, self.running = device, rank, 0, False
        self.warm, self.out_dir = warm, out_dir or Path(".")
        self.written: dict[str, Any] = {}  # the profile's paths, once written

    def on_step_end(self, end: StepEnd) -> None:
        if end.measured:
            self.step_done()
        elif end.step == self.warm:
            self.start()

    def on_finish(self, world_size: int) -> None:
        self.written = self.write(self.out_dir, world_size)

    def summary(self) -> dict[str, Any]:
        return self.written

    def start(self) -> None:
        self.prof.start()
        self.running = True

    def step_done(self) -> None:
        """Count a profiled step (a ``ProfilerStep#N`` span in the trace); stop after ``MAX_PROFILED_STEPS``."""
        if self.running:
            self.prof.step()
            self.steps += 1
            if self.steps >= MAX_PROFILED_STEPS:
                self.stop()

    def stop(self) -> None:
        if self.running:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.prof.stop()
            self.running = False

    def rows(self) -> list[dict[str, Any]]:
        """One row per operator: calls and seconds per profiled step, heaviest self time first."""
        n = max(1, self.steps)
        out = []
        for ev in self.prof.key_averages():
            dev = getattr(ev, "self_device_time_total", 0) or getattr(ev, "self_cuda_time_total", 0) or 0
            out.append({"name": ev.key, "range": bool(getattr(ev, "is_user_annotation", False)),
                        "calls_per_step": ev.count / n,
                        "self_s_per_step": ev.self_cpu_time_total / 1e6 / n,
                        "total_s_per_step": ev.cpu_time_total / 1e6 / n,
                        "self_device_s_per_step": dev / 1e6 / n})
        out.sort(key=lambda r: -(r["self_device_s_per_step"] or r["self_s_per_step"]))
        return out

    def write(self, folder: Path, world_size: int) -> dict[str, Any]:
        """Write this rank's trace (and on rank 0 the table and the JSON); returns their paths for the summary."""
        self.stop()
        # A folder of traces only: HTA takes every JSON file of its trace_dir for a rank's trace.
        (folder / "traces").mkdir(parents=True, exist_ok=True)
        self.prof.export_chrome_trace(str(folder / "traces" / f"trace_rank{self.rank}.json"))
        traces = [str(folder / "traces" / f"trace_rank{r}.json") for r in range(world_size)]
        if self.rank != 0:
            return {"profile_traces": traces}
        sort_by = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = folder / "profile_rank0.txt"
        table.write_text(f"# rank 0, world size {world_size}, {self.steps} profiled steps\n"
                         + self.prof.key_averages().table(sort_by=sort_by, row_limit=40) + "\n")
        data = folder / "profile_rank0.json"
        data.write_text(json.dumps({"rank": 0, "world_size": world_size, "steps": self.steps,
                                    "device": self.device.type, "ops": self.rows()}, indent=1) + "\n")
        logger.info(f"profile of {self.steps} steps written to {table}")
        return {"profile_table": str(table), "profile_json": str(data), "profile_traces": traces}
