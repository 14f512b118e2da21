"""Replay seeds 51-57's saved windows with the gate emulated: others used 1 core of the host from a neighbour's or
quota's onset, none otherwise (the column a live run records).

    python benchmarks/campaigns/gate_emulation_cores.py FILES
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


def gated(run: dict) -> list:
    outside = run["kind"] in ("neighbour", "quota")
    return [[[s, c, w, q, 1.0 if outside and s >= run["step"] else 0.0] for s, c, w, q, *_ in row]
            for row in run["windows"]]


def main() -> None:
    runs = [json.loads(line) for f in sys.argv[1:] for line in open(f) if line.strip()]
    settings = {"drift": straggler_detector.DRIFT, "threshold": straggler_detector.THRESHOLD, "drift_sigmas": straggler_detector.DRIFT_SIGMAS,
                "threshold_sigmas": straggler_detector.THRESHOLD_SIGMAS}
    print(json.dumps(replay.score(runs, 5, False, settings, rows=gated, verbose=True)))


if __name__ == "__main__":
    main()
