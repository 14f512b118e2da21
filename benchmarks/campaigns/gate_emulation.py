"""Replay the fault benchmark's saved windows as if a rank's wait for a CPU counted only while something outside
the job's ranks took CPU on its host (a neighbour or a CPU quota from the fault's onset; nothing in clean runs).

    python benchmarks/campaigns/gate_emulation.py base|gate THRESHOLD FILE...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))  # straggler_replay, beside this script
sys.path.insert(0, str(HERE.parents[2] / "src"))

import straggler_replay as replay  # noqa: E402

from trainscale.train.instruments import straggler_detector  # noqa: E402


def main() -> None:
    mode, threshold, files = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    runs = [json.loads(line) for f in files for line in open(f) if line.strip()]

    def gated(run: dict) -> list:  # the wait counts from the onset of a neighbour or a quota, never otherwise
        outside = run["kind"] in ("neighbour", "quota")
        return [[[s, c, w, q if outside and s >= run["step"] else 0.0] for s, c, w, q, *_ in row]
                for row in run["windows"]]
    settings = {"drift": straggler_detector.DRIFT, "threshold": threshold, "drift_sigmas": straggler_detector.DRIFT_SIGMAS,
                "threshold_sigmas": straggler_detector.THRESHOLD_SIGMAS}
    print(json.dumps({"mode": mode, **replay.score(runs, 5, False, settings,
                                                   **({"rows": gated} if mode == "gate" else {}))}))


if __name__ == "__main__":
    main()
