"""A/B of clean fault-job runs across source trees, alternated: per run, the share of scored windows (after the
first two) whose ranks' own-time ratio is beyond 1.4x either way, and whether the summary has an episode.

    python benchmarks/campaigns/clean_ab.py N   # N rounds; the trees below must exist (git worktree add /tmp/old e77e1c1)
"""

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

TREES = {"old": "/tmp/old", "new": "/work/main", "nopause": "/tmp/nopause"}
JOB = ["--steps", "80", "--log.straggler_every", "5", "--job.timeout_s", "6", "--log.progress", "none",
       "--log.metrics", "false", "--data.eval_size", "0"]


def _fault_job(tree: str) -> str:
    """The fault job of a source tree: in benchmarks/campaigns/ since 2026-11-28, in benchmarks/ before."""
    new = f"{tree}/benchmarks/campaigns/_fault_job.py"
    return new if os.path.exists(new) else f"{tree}/benchmarks/_fault_job.py"


def one(tree: str) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PYTHONPATH": f"{tree}/src", "TRAINSCALE_JSON": f"{d}/s.json",
               "TRAINSCALE_BENCH_WINDOWS": f"{d}/w.jsonl", "TRAINSCALE_BENCH_FAULT": ""}
        cmd = [sys.executable, "-m", "trainscale", "launch", "--nproc-per-node", "2", _fault_job(tree), *JOB]
        subprocess.run(cmd, env=env, cwd=d, capture_output=True, timeout=120)
        with open(f"{d}/w.jsonl") as f:
            windows = [json.loads(line) for line in f]
        with open(f"{d}/s.json") as f:
            episodes = json.load(f).get("stragglers", [])
    logs = [abs(math.log((w[0][1] + w[0][2] + w[0][3]) / (w[1][1] + w[1][2] + w[1][3]))) for w in windows[2:]]
    return sum(x > math.log(1.4) for x in logs) / len(logs), statistics.median(logs), len(episodes)


def main() -> None:
    res: dict[str, list[tuple[float, float, int]]] = {k: [] for k in TREES}
    order = list(TREES)
    for i in range(int(sys.argv[1])):
        for name in order[i % 3:] + order[:i % 3]:
            res[name].append(one(TREES[name]))
        print(i, {k: v[-1] for k, v in res.items()}, flush=True)
    for k, v in res.items():
        print(k, "beyond 1.4x:", round(statistics.mean(x[0] for x in v), 3),
              "median |log ratio|:", round(statistics.median(x[1] for x in v), 3),
              "runs with episodes:", sum(x[2] > 0 for x in v), "/", len(v))


if __name__ == "__main__":
    main()
