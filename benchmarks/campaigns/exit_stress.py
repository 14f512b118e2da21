"""Does a finished run end cleanly? N consecutive 2-process launches of each way trainscale's processes end,
beside a nice'd CPU hog, counting aborts at interpreter exit and any other non-zero exit.

An abort is exit -6 / 134, or "terminate called" in the output (torchrun reports a rank's SIGABRT as
``exitcode: -6``): a finished job reported as killed. The paths alternate launch by launch, so a change in the
machine's load falls on every path alike. Last line: one JSON object with the counts per path.

    python benchmarks/campaigns/exit_stress.py --n 200
    python benchmarks/campaigns/exit_stress.py --n 20 --paths train,trainer --src /path/to/other/checkout/src
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "_exit_job.py"
TINY = ["--model.name", "mlp", "--model.width", "8", "--data.name", "synthetic", "--data.image_size", "4",
        "--data.channels", "1", "--data.train_size", "64", "--data.eval_size", "8", "--data.batch_size", "8",
        "--steps", "3", "--log.progress", "none", "--job.threads", "1"]
ABORT_MARKS = ("terminate called", "exitcode: -6", "Signal 6 (SIGABRT)")


def _train(*extra: str) -> Callable[[Path], tuple[list[str], dict[str, str]]]:
    return lambda d: (["train", "--nproc", "2", *TINY, "--json", str(d / "s.json"), *extra], {})


def _script(mode: str, env: Callable[[Path], dict[str, str]] = lambda d: {}) -> Callable[[Path], tuple[list[str], dict[str, str]]]:
    return lambda d: (["launch", "--nproc-per-node", "2", str(JOB), mode, str(d)], env(d))


# path -> (trainscale arguments, extra environment) in a fresh folder
PATHS: dict[str, Callable[[Path], tuple[list[str], dict[str, str]]]] = {
    # trainscale train: Trainer under the launcher; watchdog heartbeat and the loader's prefetch thread on
    "train": _train(),
    # async DCP writes on their own group, a loader worker process, the TensorBoard tracker
    "train-dcp-async-workers-tracker": lambda d: _train(
        "--checkpoint.dir", str(d / "ck"), "--checkpoint.format", "dcp", "--checkpoint.async_save", "true",
        "--checkpoint.every", "1", "--data.workers", "1", "--log.tracker", "tensorboard",
        "--log.tracker_dir", str(d / "tb"))(d),
    # on the CPU also where there is a GPU: two processes sharing one get Gloo, whose send cannot read CUDA memory
    "pipeline": _train("--strategy.pipeline_stages", "2", "--strategy.microbatches", "2", "--job.device", "cpu"),
    "runapi": _script("runapi"),
    "runapi-nofinish": _script("runapi-nofinish"),
    # Trainer from Python in the user's own group; the user's collective and destroy_process_group() after fit()
    "trainer": _script("trainer"),
    # the lab's runs: a run-API script with its experiment switched on through the environment
    "lab": _script("runapi", lambda d: {"TRAINSCALE_ARGS": "--ablate.phases base,no_comm --ablate.phase_steps 2 --job.steps 8",
                                        "TRAINSCALE_JSON": str(d / "run.json")}),
    # the planner's calibration probe
    "probe": lambda d: (["launch", "--nproc-per-node", "2", "-m", "trainscale.strategies.probe", "--out", str(d / "p.json"),
                         "--sizes", "4096", "--budget", "0.01", "--spin", "0.05"], {}),
}


def classify(rc: int, text: str) -> str:
    """``ok``, ``abort`` (SIGABRT at exit, "terminate called") or ``nonzero`` (any other failure)."""
    if rc in (-6, 134) or any(m in text for m in ABORT_MARKS):
        return "abort"
    return "ok" if rc == 0 else "nonzero"


def launch_once(path: str, src: Path, timeout: float) -> tuple[str, float, str]:
    """One launch of ``path``: (outcome, seconds, the output's tail)."""
    with tempfile.TemporaryDirectory(prefix="exit-stress-") as d:
        argv, extra = PATHS[path](Path(d))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
        env["PYTHONPATH"] = os.pathsep.join([str(src), str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env.pop("RANK", None)
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-m", "trainscale", *argv], capture_output=True, text=True,
                               timeout=timeout, env=env, cwd=d)
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = -9, f"timed out after {timeout:g} s\n{e.stderr or ''}"
        return classify(rc, text), time.perf_counter() - t0, text[-4000:]


def start_hog() -> subprocess.Popen:
    """A CPU hog at nice 10 beside the launches: what a loaded machine looks like."""
    return subprocess.Popen(["nice", "-n", "10", "sh", "-c", "while :; do :; done"])


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200, help="launches per path")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, from: {', '.join(PATHS)}")
    p.add_argument("--src", default=str(HERE.parents[1] / "src"), help="the trainscale source tree to run")
    p.add_argument("--timeout", type=float, default=180, help="seconds per launch")
    p.add_argument("--no-hog", action="store_true", help="no CPU hog beside the launches")
    p.add_argument("--logs", default="", help="folder for the output of every failed launch")
    a = p.parse_args()
    paths = [x for x in a.paths.split(",") if x]
    bad = [x for x in paths if x not in PATHS]
    if bad or a.n < 1:
        sys.exit(f"exit_stress: --paths {','.join(bad)}: unknown (accepted: {', '.join(PATHS)})" if bad
                 else f"exit_stress: --n {a.n}: must be at least 1")
    counts = {x: {"runs": 0, "aborts": 0, "other_nonzero": 0, "seconds": 0.0} for x in paths}
    logs = Path(a.logs) if a.logs else None
    signal.signal(signal.SIGTERM, _interrupt)  # kill PID: the counts so far still come out
    signal.signal(signal.SIGINT, _interrupt)  # also when started in the background, where SIGINT is ignored
    hog = None if a.no_hog else start_hog()
    t0, done = time.perf_counter(), 0
    try:
        for i in range(a.n):
            for x in paths:
                outcome, secs, tail = launch_once(x, Path(a.src), a.timeout)
                c = counts[x]
                c["runs"] += 1
                c["seconds"] += secs
                if outcome != "ok":
                    c["aborts" if outcome == "abort" else "other_nonzero"] += 1
                    print(f"[{i + 1}/{a.n}] {x}: {outcome}\n{tail[-1500:]}", file=sys.stderr, flush=True)
                    if logs is not None:
                        logs.mkdir(parents=True, exist_ok=True)
                        (logs / f"{x}-{i + 1}-{outcome}.txt").write_text(tail)
            done = i + 1
            so_far = {x: f"{c['aborts']}/{c['other_nonzero']}" for x, c in counts.items()}
            print(f"[{done}/{a.n}] aborts/other per path: {so_far} ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
    except KeyboardInterrupt:  # stopped by hand: the counts so far, of the rounds completed and the one under way
        print(f"interrupted after {done} complete rounds", file=sys.stderr)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    for c in counts.values():
        c["seconds"] = round(c["seconds"], 1)
    print(json.dumps({"n": a.n, "rounds_done": done, "hog": hog is not None, "wall_s": round(time.perf_counter() - t0, 1),
                      "paths": counts}))


if __name__ == "__main__":
    main()
