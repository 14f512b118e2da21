"""``trainscale bench``: a scaling sweep over world sizes, with a report.

For each world size it runs ``trainscale train --nproc N [your options] --json ...`` ``--repeat`` times and
reports samples/s, speed-up, scaling efficiency = throughput(N) / (N x throughput(1)) with its range over
pairings of repeats, the scaling overhead per iteration (T_N - T_1 at the same per-device batch, as scaling overhead is usually defined:
everything that grows with processes, not communication alone), data-wait fraction, medians and spreads,
a per-rank chart and a timeline of one run at the largest size. The report opens with a verdict and the
``trainscale doctor`` command to run next. Weak scaling (fixed per-device batch) by default;
``--scaling strong`` fixes the global batch.

Example::

    trainscale bench --nproc 1,2 --out runs/bench
    trainscale bench --nproc 1,4,8 --model se_resnext152 --data synthetic --batch-size 40 --repeat 3
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.progress import Progress, TaskID

from ..config import Config, ConfigError, config_to_dict
from ..jobs import LauncherOptions, RunFailed, RunSpec, check_train_args, instrumented, run_train, split_script
from ..nodes import add_node_options, follow, launcher_options, leading, nodes
from ..reporting import write_json
from .bench_analysis import complete_points, make_point, run_record
from .bench_report import print_result, write_plots, write_report
from .common import cores, machine_description, parse_nproc_list
from .plans import BenchPlan
from .progress import LabProgress
from .verdict import bench_verdict

__all__ = ["main", "make_point", "complete_points"]


def _parser() -> argparse.ArgumentParser:
    """The options of ``trainscale bench``; the rest go to ``trainscale train``."""
    p = argparse.ArgumentParser(
        prog="trainscale bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Scaling sweep: run the training job at several world sizes and report speed-up, "
                    "scaling efficiency and scaling overhead. Other options go to `trainscale train`, or, after `-- "
                    "[python] my_train.py [args]`, to your own script on the run API (trainscale.init()).",
        epilog="examples:\n  trainscale bench --nproc 1,2 --out runs/bench\n"
               "  trainscale bench --nproc 1,2 -- python my_train.py --my-args     # your own script on the run API\n"
               "  trainscale bench --nproc 1,2,4 --scaling strong --batch-size 128 --repeat 5\n"
               "  trainscale bench --nproc 8 --nnodes 2 --rdzv-endpoint node0:29400 ...   # on each node")
    p.add_argument("--nproc", default="1,2", help="processes per node to sweep, comma-separated (default 1,2)")
    p.add_argument("--repeat", type=int, default=3, help="runs per point; medians and spreads over them (default 3)")
    p.add_argument("--scaling", choices=("weak", "strong"), default="weak",
                   help="weak: fixed per-device batch (default); strong: fixed global batch")
    p.add_argument("--out", default="runs/bench", help="folder for bench.json, report.md/html and plots")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take before it is ended")
    p.add_argument("--calibration", metavar="FILE",
                   help="a `trainscale plan calibrate` file of this job: show the forecast step time beside each point")
    add_node_options(p)
    return p


def main(argv: list[str]) -> int:
    """Entry of ``trainscale bench``: check the options, run the sweep, analyse, write and print the report."""
    given = argv[argv.index("--") + 1:] if "--" in argv else None
    argv, script = split_script(argv)
    args, rest = _parser().parse_known_args(argv)
    launcher = launcher_options(args)
    plan, cfg, forecast = _check(args, rest, nodes(launcher))
    if instrumented(script) and not cfg.job.threads:  # an unported script: the same threads at 1 and N
        rest = [*rest, "--job.threads", str(max(1, cores() // max(plan.nprocs)))]
    if launcher.node_rank > 0:  # node 0 runs the sweep and writes the report; this node takes part in its runs
        return follow(launcher, args.timeout)
    out = Path(args.out)
    doc = _new_doc(args, plan, cfg, rest, script, launcher)
    doc["config"]["command_as_given"] = given  # the user's launcher and its settings; the lab owns the launch
    with leading(launcher):
        out.mkdir(parents=True, exist_ok=True)  # once the lab's store is up: a refused port leaves no folder
        _Sweep(plan, rest, script, launcher, args.timeout, out).run(doc, forecast)
    complete_points(doc["points"], plan.scaling)
    doc["verdict"] = bench_verdict(doc["points"], rest, script)
    plots = write_plots(doc["points"], doc["runs"], out)
    write_json(out / "bench.json", doc)
    write_report(out, doc)
    print_result(doc, out, plots)
    return 1 if doc["error"] else 0


def _check(args: argparse.Namespace, rest: list[str], nnodes: int) -> tuple[BenchPlan, Config, dict[int, float]]:
    """The plan, the train options and the forecast per world size, all checked before anything runs."""
    nprocs = parse_nproc_list(args.nproc)
    if args.repeat < 1:
        raise ConfigError("--repeat", args.repeat, "must be >= 1")
    cfg = check_train_args(rest)
    forecast = {}
    if args.calibration:  # checked before any run: another job's calibration is refused now
        from ..sim.beside import forecast_steps

        forecast = forecast_steps(args.calibration, rest, [n * nnodes for n in nprocs])
    plan = BenchPlan(tuple(nprocs), args.repeat, args.scaling, nnodes, cfg.data.batch_size)
    return plan, cfg, forecast


def _new_doc(args: argparse.Namespace, plan: BenchPlan, cfg: Config, rest: list[str], script: list[str] | None,
             launcher: LauncherOptions) -> dict[str, Any]:
    """bench.json before the first run: no points yet, the machine and the sweep's configuration."""
    return {
        "points": [], "runs": [], "commands": [], "error": None, "machine": machine_description(),
        "config": {"scaling": plan.scaling, "repeat": plan.repeat, "nproc": list(plan.nprocs), "nnodes": launcher.nnodes,
                   "train_args": rest, "script": script, "model": cfg.model.name if not script else " ".join(script),
                   "data": cfg.data.name if not script else "user", "steps": cfg.job.steps,
                   "skip_first": cfg.log.skip_first, "batch_size": cfg.data.batch_size, "train": config_to_dict(cfg)},
    }


class _Sweep:
    """The runner: executes the plan's runs in order, keeping each run's command and summary in bench.json."""

    def __init__(self, plan: BenchPlan, user: list[str], script: list[str] | None, launcher: LauncherOptions,
                 timeout: float, out: Path):
        self.plan, self.user, self.script, self.launcher, self.timeout, self.out = (
            plan, user, script, launcher, timeout, out)

    def run(self, doc: dict[str, Any], forecast: dict[int, float]) -> None:
        """Measure every point, writing bench.json after each; a failed run ends the sweep with ``doc["error"]``."""
        with LabProgress("bench") as bar:
            task = bar.add_task("", total=self.plan.total_runs)
            for n in self.plan.nprocs:
                runs = self._point(n, doc, bar, task)
                if runs is None:
                    return  # partial results: the points measured so far stay in bench.json
                doc["points"].append(make_point(n, self.plan.world(n), runs))
                if self.plan.world(n) in forecast:
                    doc["points"][-1]["forecast_step_time_s"] = forecast[self.plan.world(n)]
                complete_points(doc["points"], self.plan.scaling)
                write_json(self.out / "bench.json", doc)

    def _point(self, n: int, doc: dict[str, Any], bar: Progress, task: TaskID) -> list[dict[str, Any]] | None:
        """The repeated runs of one point, or None when one failed (then ``doc["error"]`` says which)."""
        world, runs = self.plan.world(n), []
        for r in range(self.plan.repeat):
            bar.update(task, description=f"{world} process(es), run {r + 1}/{self.plan.repeat}")
            spec = RunSpec(n, self.plan.run_args(self.user, n), self.out / "runs" / f"n{world}_r{r}.json",
                           f"run with {world} process(es)", self.launcher, self.script)
            doc["commands"].append(spec.shell())
            try:
                summary = run_train(spec, self.timeout)
            except RunFailed as e:
                doc["error"] = {"nproc": world, "repeat": r + 1, "message": e.detail, "command": spec.shell()}
                return None
            runs.append(summary)
            doc["runs"].append(run_record(summary))
            bar.advance(task)
        return runs
