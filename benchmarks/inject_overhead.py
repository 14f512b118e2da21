"""The cost of trainscale's injection on an unmodified script's step: the plain DDP script with and without it.

The script (``tests/inject/scripts/ddp_train.py``, 2 ranks on Gloo under torchrun, 1 intra-op thread each)
times its own loop after 5 warm-up steps and prints it (``ms/step``), so both arms are measured by the same
clock in the same code. The instrumented arm runs as the doctor's base phase does (``TRAINSCALE_INJECT=1``,
the per-rank accounting on, no experiment switched). Runs alternate in ABBA order so that a slow spell of a
shared machine falls on both arms; ``overhead_ratio`` is the median over ABBA groups of the instrumented
mean over the plain mean. Last line: one JSON object.

Run: python benchmarks/inject_overhead.py [--groups 3 --steps 300 --width 512]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "inject" / "scripts" / "ddp_train.py"


def one_run(instrumented: bool, steps: int, width: int) -> float:
    """Milliseconds per step that the script measured itself."""
    sys.path.insert(0, str(REPO / "src"))
    from trainscale.inject import ENABLE, pythonpath

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSCALE_")}
    env["OMP_NUM_THREADS"] = "1"
    if instrumented:
        folder = tempfile.mkdtemp(prefix="inject_overhead_")
        env.update({ENABLE: "1", "PYTHONPATH": pythonpath(env.get("PYTHONPATH", "")),
                    "TRAINSCALE_JSON": str(Path(folder) / "summary.json"), "TRAINSCALE_ARGS": f"--log.progress none --job.steps {steps + 10}"})  # the script's end first
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
           "--steps", str(steps), "--width", str(width)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=True).stdout
    match = re.search(r"([0-9.]+) ms/step", out)
    if match is None:
        raise RuntimeError(f"no ms/step in the script's output: {out[-500:]}")
    return float(match.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--width", type=int, default=512)
    a = p.parse_args()
    plain, inst, ratios = [], [], []
    for g in range(a.groups):
        arms = [True, False, False, True] if g % 2 else [False, True, True, False]
        times = {True: [], False: []}
        for arm in arms:
            times[arm].append(one_run(arm, a.steps, a.width))
            print(f"group {g}: {'instrumented' if arm else 'plain'} {times[arm][-1]:.3f} ms/step", flush=True)
        plain += times[False]
        inst += times[True]
        ratios.append(statistics.fmean(times[True]) / statistics.fmean(times[False]))
    print(json.dumps({"benchmark": "inject_overhead", "steps": a.steps, "width": a.width, "groups": a.groups,
                      "plain_ms": plain, "instrumented_ms": inst, "overhead_ratio": statistics.median(ratios),
                      "group_ratios": ratios}))


if __name__ == "__main__":
    main()
