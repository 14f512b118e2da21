"""Replay the windows the live straggler monitor scored in fault-benchmark runs through its detector, with other
settings: how many faults each names with the right rank and cause, and how many clean runs it calls slow,
without running the jobs again.

    python benchmarks/fault_localisation.py --runs 24 --kinds sleep,data,neighbour,quota,gc --overhead-chunks 0 \\
        --out runs.jsonl --windows
    python benchmarks/straggler_replay.py runs.jsonl --drift 1.4 --threshold 0.5

With ``--windows`` each line of the benchmark's ``--out`` file holds, beside the run's truth, every window rank 0
scored (per rank: the window's last step and its median compute, data wait and run-queue wait over
``log.straggler_every`` steps). The answer is judged as the benchmark judges the live one: the first episode of
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from trainscale.train.instruments import stragglers  # noqa: E402
from trainscale.train.instruments.stragglers import StragglerDetector, Window  # noqa: E402


def replay(rows: list[list[list[float]]], every: int, no_runq: bool, **settings: float) -> StragglerDetector:
    """Feed one run's windows (per window, per rank: step, compute, wait, runq) to a fresh detector."""
    det = StragglerDetector(world=len(rows[0]), every=every, **settings)
    for row in rows:
        det.update([Window(int(step), c, w, math.nan if no_runq else q, "", r)
                    for r, (step, c, w, q) in enumerate(row)])
    return det


def verdict(run: dict[str, Any], det: StragglerDetector) -> tuple[str, int | None]:
    """The benchmark's verdict on the replayed episodes, and the detection delay in steps of a right one."""
    if not run["kind"]:
        return (f"false_alarm ({det.episodes[0].cause})" if det.episodes else "clean"), None
    after = [e for e in det.episodes if e.detected_at_step >= run["step"]]
    if not after:
        return "missed", None
    e = next((e for e in after if e.rank == run["rank"]), after[0])
    if e.rank != run["rank"]:
        return "wrong", None
    if e.cause == "unknown":
        return "unknown", None
    return ("right" if e.cause == run["truth"] else f"wrong ({e.cause})"), e.detected_at_step - run["step"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="the benchmark's --out files, run with --windows (JSONL, a run a line)")
    ap.add_argument("--every", type=int, default=5, help="log.straggler_every of those runs (the benchmark's: 5)")
    ap.add_argument("--drift", type=float, default=math.exp(stragglers.DRIFT),
                    help="ratio to the other ranks under which a rank gathers no evidence (default %(default).2f)")
    ap.add_argument("--threshold", type=float, default=stragglers.THRESHOLD,
                    help="CUSUM sum of log-ratio excess that declares a rank slow (default %(default)s)")
    ap.add_argument("--drift-sigmas", type=float, default=stragglers.DRIFT_SIGMAS,
                    help="the drift grows to this many of the run's measured noise (default %(default)s)")
    ap.add_argument("--threshold-sigmas", type=float, default=stragglers.THRESHOLD_SIGMAS,
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
    tally: dict[str, int] = {}
    per_kind: dict[str, list[int]] = {}
    delays: list[int] = []
    alarms: dict[str, int] = {}  # false alarms by the cause their first episode named
    for run in runs:
        if run["truth"] not in ("clean", "compute", "data", "cpu_contention") or not run.get("windows"):
            continue  # hangs and failures are not the monitor's to name
        said, delay = verdict(run, replay(run["windows"], a.every, a.no_runq, **settings))
        key = said.split(" ")[0]
        tally[key] = tally.get(key, 0) + 1
        if run["kind"]:
            k = per_kind.setdefault(run["kind"], [0, 0])
            k[0] += key == "right"
            k[1] += 1
        if key == "false_alarm":
            cause = said.split("(")[1].rstrip(")")
            alarms[cause] = alarms.get(cause, 0) + 1
        if delay is not None and key == "right":
            delays.append(delay)
        if a.verbose and key not in ("right", "clean"):
            print(f"run {run['i']}: {run['kind'] or 'clean'} rank {run['rank']} step {run['step']}: {said}",
                  file=sys.stderr)
    injected = sum(v[1] for v in per_kind.values())
    print(json.dumps({
        "right": tally.get("right", 0), "injected": injected, "missed": tally.get("missed", 0),
        "wrong": tally.get("wrong", 0), "unknown": tally.get("unknown", 0),
        "false_alarms": tally.get("false_alarm", 0), "false_alarm_causes": alarms, "clean_runs": tally.get("false_alarm", 0) + tally.get("clean", 0),
        "median_detection_steps": statistics.median(delays) if delays else None,
        "per_kind": {k: f"{v[0]}/{v[1]}" for k, v in sorted(per_kind.items())},
        "drift": a.drift, "threshold": a.threshold, "no_runq": a.no_runq}))


if __name__ == "__main__":
    main()
