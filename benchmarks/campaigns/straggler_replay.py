"""Replay the windows the live straggler monitor scored in fault-benchmark runs through its detector, with other
settings: how many faults each names with the right rank and cause, and how many clean runs it calls slow,
without running the jobs again.

    python benchmarks/campaigns/fault_localisation.py --runs 24 --kinds sleep,data,neighbour,quota,gc --overhead-chunks 0 \\
        --out runs.jsonl --windows
    python benchmarks/campaigns/straggler_replay.py runs.jsonl --drift 1.4 --threshold 0.5

With ``--windows`` each line of the benchmark's ``--out`` file holds, beside the run's truth, every window rank 0
scored (per rank: the window's last step and its median compute, data wait and run-queue wait over
``log.straggler_every`` steps, and in runs since the gate the cores others used on the rank's host). The answer is judged as the benchmark judges the live one: the first episode of
the faulty rank detected at or after the onset (else the first episode of another rank after it: wrong), "cause
unknown" counted apart, any episode in a clean run a false alarm. ``--no-runq`` drops the run-queue wait, as a run without the time
accounting (``--log.accounting false``, or not Linux) sees it.

Last line: one JSON object (``right``, ``injected``, ``missed``, ``wrong``, ``unknown``, ``false_alarms``,
``false_alarm_causes``, ``clean_runs``, ``median_detection_steps``, ``per_kind``, the settings).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fault_localisation as bench  # noqa: E402

from trainscale.train.instruments import straggler_detector  # noqa: E402
from trainscale.train.instruments.straggler_detector import StragglerDetector, Window  # noqa: E402


def replay(rows: list[list[list[float]]], every: int, no_runq: bool, **settings: float) -> StragglerDetector:
    """Feed one run's windows (per window, per rank: step, compute, wait, runq and, since the gate, the cores
    others used on the rank's host, infinite where its quota held it) to a fresh detector."""
    det = StragglerDetector(world=len(rows[0]), every=every, **settings)
    for row in rows:
        det.update([Window(int(step), c, w, math.nan if no_runq else q, "", r, *other, held=math.inf in other)
                    for r, (step, c, w, q, *other) in enumerate(row)])
    return det


def judged(run: dict[str, Any], det: StragglerDetector) -> bench.Run:
    """The run judged on the replayed episodes, as the benchmark judges the live ones."""
    r = bench.Run(run["i"], run["kind"], run["nproc"], run["rank"], run["step"], truth=run["truth"], rc=0)
    bench.judge_episodes(r, [e.as_dict() for e in det.episodes])
    r.verdict = bench.verdict(r)
    return r


def score(runs: list[dict[str, Any]], every: int, no_runq: bool, settings: dict[str, float],
          rows: Callable[[dict[str, Any]], list[Any]] = lambda run: run["windows"],
          verbose: bool = False) -> dict[str, Any]:
    """Replay every slow or clean run (its windows as ``rows`` gives them) and tally the answers as the benchmark
    does."""
    tally: dict[str, int] = {}
    per_kind: dict[str, list[int]] = {}
    delays: list[int] = []
    alarms: dict[str, int] = {}  # false alarms by the cause their first episode named
    for run in runs:
        if run["truth"] not in ("clean", "compute", "data", "cpu_contention") or not run.get("windows"):
            continue  # hangs and failures are not the monitor's to name
        r = judged(run, replay(rows(run), every, no_runq, **settings))
        tally[r.verdict] = tally.get(r.verdict, 0) + 1
        if r.kind:
            k = per_kind.setdefault(r.kind, [0, 0])
            k[0] += r.verdict == "right"
            k[1] += 1
        if r.verdict == "false_alarm":
            alarms[r.said] = alarms.get(r.said, 0) + 1
        if r.verdict == "right" and r.detection_steps is not None:
            delays.append(r.detection_steps)
        if verbose and r.verdict not in ("right", "clean"):
            print(f"run {r.i}: {r.kind or 'clean'} rank {r.rank} step {r.step}: {r.verdict}"
                  + (f" ({r.said} on rank {r.said_rank[0]})" if r.said else ""), file=sys.stderr)
    return {"right": tally.get("right", 0), "injected": sum(v[1] for v in per_kind.values()),
            "missed": tally.get("missed", 0), "wrong": tally.get("wrong", 0), "unknown": tally.get("unknown", 0),
            "false_alarms": tally.get("false_alarm", 0), "false_alarm_causes": alarms,
            "clean_runs": tally.get("false_alarm", 0) + tally.get("clean", 0),
            "median_detection_steps": statistics.median(delays) if delays else None,
            "per_kind": {k: f"{v[0]}/{v[1]}" for k, v in sorted(per_kind.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="the benchmark's --out files, run with --windows (JSONL, a run a line)")
    ap.add_argument("--every", type=int, default=bench.EVERY,
                    help="log.straggler_every of those runs (the benchmark's: %(default)s)")
    ap.add_argument("--drift", type=float, default=math.exp(straggler_detector.DRIFT),
                    help="ratio to the other ranks under which a rank gathers no evidence (default %(default).2f)")
    ap.add_argument("--threshold", type=float, default=straggler_detector.THRESHOLD,
                    help="CUSUM sum of log-ratio excess that declares a rank slow (default %(default)s)")
    ap.add_argument("--drift-sigmas", type=float, default=straggler_detector.DRIFT_SIGMAS,
                    help="the drift grows to this many of the run's measured noise (default %(default)s)")
    ap.add_argument("--threshold-sigmas", type=float, default=straggler_detector.THRESHOLD_SIGMAS,
                    help="the threshold grows to this many of the run's measured noise (default %(default)s)")
    ap.add_argument("--no-runq", action="store_true", help="leave out the run-queue wait (no time accounting)")
    ap.add_argument("--verbose", action="store_true", help="a line per run that was not right or clean")
    a = ap.parse_args()
    if a.drift <= 1 or a.threshold <= 0:
        sys.exit(f"straggler_replay: --drift must be > 1 and --threshold > 0 (got {a.drift}, {a.threshold})")
    settings = {"drift": math.log(a.drift), "threshold": a.threshold, "drift_sigmas": a.drift_sigmas,
                "threshold_sigmas": a.threshold_sigmas}
    if missing := [f for f in a.runs if not Path(f).is_file()]:
        sys.exit(f"straggler_replay: no such file: {' '.join(missing)} (give fault_localisation.py's --out files)")
    runs = [json.loads(line) for f in a.runs for line in Path(f).read_text().splitlines() if line.strip()]
    if not any(run.get("windows") for run in runs):
        sys.exit(f"straggler_replay: no windows in {' '.join(a.runs)}: run fault_localisation.py with --windows")
    result = score(runs, a.every, a.no_runq, settings, verbose=a.verbose)
    print(json.dumps({**result, "drift": a.drift, "threshold": a.threshold, "no_runq": a.no_runq}))

if __name__ == "__main__":
    main()
