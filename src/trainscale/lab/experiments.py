"""The lab's runner: runs one experiment as a job (through ``trainscale.jobs``), logs it, splits its phases.

Every experiment is a command a user could type; the runner keeps each run's summary under ``OUT/runs/`` and a
log line per phase for the report, and ends the whole diagnosis on the first failed run (``RunFailed``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.progress import Progress, TaskID

from ..jobs import LauncherOptions, RunSpec, run_train
from ..nodes import nodes
from .stats import job_step_time

__all__ = ["Lab", "phase_parts", "injected_note"]


def phase_parts(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A phased run's summary as one summary per phase (the run's fields with that phase's timings)."""
    return {ph: {**summary, **v} for ph, v in summary["phases"].items()}


def injected_note(runs: dict[tuple[str, int], list[dict[str, Any]]], log: list[dict[str, Any]]
                  ) -> dict[str, Any] | None:
    """For a script instrumented from outside: its framework, what was measured, and which experiments ran
    (``log``: the lab's log of runs, whose ``experiment`` names a phase or a second-level run)."""
    seen = [s for parts in runs.values() for s in parts if s.get("injected")]
    if not seen:
        return None
    inj = seen[0]["injected"]
    unrun = {k: v for s in seen for k, v in (s["injected"].get("experiments_not_run") or {}).items()}
    unrun.setdefault("sleep", "the sleep test replaces the model's operators: not run on a script trainscale did "
                              "not build")
    ran = sorted({e["experiment"].split(" (")[0] for e in log} - set(unrun))
    unmeasured = {k: v for k, v in inj["measurements"].items() if not v.startswith("measured")}
    fw = inj["framework"]
    evals = max(s["injected"].get("setup", {}).get("evaluation_passes") or 0 for s in seen)
    line = (f"Your script as it is ({fw['name']} {fw.get('version') or ''}): experiments run: {', '.join(ran)}"
            + "".join(f"; {k} not run: {v}" for k, v in unrun.items())
            + "".join(f"; {k} {v}" for k, v in unmeasured.items())
            + (f"; {evals} evaluation pass(es) between steps in a run (the model without gradients), left out of "
               "the step times" if evals else ""))
    return {"framework": fw, "ddp": inj.get("ddp"), "experiments_run": ran, "experiments_not_run": unrun,
            "not_measured": unmeasured, "evaluation_passes": evals, "line": line}


class Lab:
    """Runs experiments, keeps every summary, and shows progress (``bar``, a rich progress with one task)."""

    def __init__(self, out: Path, user: list[str], timeout: float, bar: Progress, task: TaskID,
                 script: list[str] | None = None, launcher: LauncherOptions | None = None):
        self.out, self.user, self.timeout, self.bar, self.task, self.script = out, user, timeout, bar, task, script
        self.launcher = launcher or LauncherOptions()
        self.log: list[dict[str, Any]] = []

    def world(self, k: int, everywhere: bool | None = None) -> int:
        """Processes of a run of ``k`` per node: on this node alone, or on every node of the lab (``everywhere``;
        by default when ``k`` > 1: the 1-process reference runs here)."""
        return k * nodes(self.launcher) if (k > 1 if everywhere is None else everywhere) else k

    def run(self, name: str, k: int, extra: list[str], r: int, everywhere: bool | None = None) -> dict[str, Any]:
        """One run of ``k`` processes per node; a run with phases is logged and returned as one summary per phase."""
        w = self.world(k, everywhere)
        self.bar.update(self.task, description=f"{name} at {w} process(es), run {r + 1}")
        spec = RunSpec(k, [*self.user, *extra], self.out / "runs" / f"{name}_n{w}_r{r}.json",
                       f"experiment {name} at {w} process(es)",
                       self.launcher if w > k else LauncherOptions(), script=self.script)
        s = run_train(spec, self.timeout)
        parts = phase_parts(s) if s.get("phases") else {name: s}
        for ph, p in parts.items():
            self.log.append({"experiment": ph if name == "phases" else f"{name} ({ph})", "nproc": w, "repeat": r,
                             "step_time_s": p["step_time_s"], "job_step_time_s": job_step_time(p),
                             "samples_per_s": p["samples_per_s"], "rank_compute_s": p.get("rank_compute_s"),
                             "rank_step_time_s": p.get("rank_step_time_s"), "data_wait_frac": p.get("data_wait_frac"),
                             "threads": p.get("threads"), "command": s["command"]})
        self.bar.advance(self.task)
        return parts if s.get("phases") else s

    def expect(self, runs: int) -> None:
        """Add ``runs`` more runs to the progress bar's total."""
        total = self.bar.tasks[0].total
        assert total is not None
        self.bar.update(self.task, total=total + runs)
