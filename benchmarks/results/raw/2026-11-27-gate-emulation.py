"""Replay the fault benchmark's saved windows as if a rank's wait for a CPU counted only while something outside
the job's ranks took CPU on its host (a neighbour or a CPU quota from the fault's onset; nothing in clean runs).

    python benchmarks/results/raw/2026-11-27-gate-emulation.py base|gate THRESHOLD FILE...
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parents[3] / "src"))

import straggler_replay as replay  # noqa: E402

from trainscale.train.instruments import stragglers  # noqa: E402


def main() -> None:
    mode, threshold, files = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    runs = [json.loads(line) for f in files for line in open(f) if line.strip()]
    tally: dict[str, int] = {}
    per_kind: dict[str, list[int]] = {}
    delays, alarms = [], {}
    for run in runs:
        if run["truth"] not in ("clean", "compute", "data", "cpu_contention") or not run.get("windows"):
            continue
        rows = run["windows"]
        if mode == "gate":  # the wait counts from the onset of a neighbour or a quota, never otherwise
            outside = run["kind"] in ("neighbour", "quota")
            rows = [[[s, c, w, q if outside and s >= run["step"] else 0.0] for s, c, w, q, *_ in row] for row in rows]
        det = replay.replay(rows, 5, False, drift=stragglers.DRIFT, threshold=threshold,
                            drift_sigmas=stragglers.DRIFT_SIGMAS, threshold_sigmas=stragglers.THRESHOLD_SIGMAS)
        r = replay.judged(run, det)
        tally[r.verdict] = tally.get(r.verdict, 0) + 1
        if r.kind:
            k = per_kind.setdefault(r.kind, [0, 0])
            k[0] += r.verdict == "right"
            k[1] += 1
        if r.verdict == "false_alarm":
            alarms[r.said] = alarms.get(r.said, 0) + 1
        if r.verdict == "right" and r.detection_steps is not None:
            delays.append(r.detection_steps)
    print(json.dumps({"mode": mode, "threshold": threshold, "verdicts": tally,
                      "per_kind": {k: f"{v[0]}/{v[1]}" for k, v in sorted(per_kind.items())},
                      "false_alarm_causes": alarms, "median_detection_steps": statistics.median(delays)}))


if __name__ == "__main__":
    main()
