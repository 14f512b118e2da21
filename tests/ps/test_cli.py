"""``trainscale ps`` as a user runs it: bad input, a short run with --json, Ctrl-C; no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIELDS = ("mode", "learners", "k", "shards", "updates", "updates_per_s", "mean_update_interval_s", "staleness_mean",
          "staleness_max", "loss_first", "loss_last", "eval_accuracy", "bytes_pushed", "bytes_pulled", "wall_s",
          "restarts")


def _env(mark: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRAINSCALE_TEST_MARK": mark}
    env.pop("RANK", None)
    env.pop("RAY_ADDRESS", None)
    return env


def _marked(mark: str) -> list[int]:
    """Processes whose environment carries ``mark`` (the CLI and everything it started: raylet, workers...)."""
    needle = f"TRAINSCALE_TEST_MARK={mark}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "environ").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def _left_behind(mark: str, wait_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + wait_s
    while (pids := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return pids


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, key", [
    (["--mode", "k-sync", "--learners", "4", "--k", "5"], "ps.k"),
    (["--mode", "k-async", "--k", "0"], "ps.k"),
    (["--mode", "gossip"], "ps.mode"),
    (["--shards", "7"], "ps.shards"),
    (["--delay", "exp:fast"], "ps.delay"),
])
def test_bad_input_is_one_line_and_exit_2(args, key):
    p = subprocess.run([sys.executable, "-m", "trainscale", "ps", *args], capture_output=True, text=True,
                       timeout=50, env=_env("bad"), cwd=REPO)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"trainscale ps: {key}"), p.stderr


# The summary's fields, the progress lines and Ray's stop on a normal end: tests/ps/test_user_job.py's CLI run.
@pytest.mark.full
@pytest.mark.timeout(150)
def test_cli_run_writes_the_summary_and_stops_ray(tmp_path):
    mark = uuid.uuid4().hex
    out = tmp_path / "ps.json"
    p = subprocess.run([sys.executable, "-m", "trainscale", "ps", "--mode", "k-sync", "--learners", "2", "--k", "1",
                        "--shards", "2", "--steps", "30", "--model.width", "32", "--log.progress", "lines",
                        "--log.every", "10", "--json", str(out)],
                       capture_output=True, text=True, timeout=140, env=_env(mark), cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads(out.read_text())
    assert all(f in s for f in FIELDS)
    assert s["mode"] == "k-sync" and s["k"] == 1 and s["updates"] == 30 and len(s["timeline"]) == 30
    assert "update 30/30" in p.stderr and "k-sync: P=2 K=1 S=2" in p.stdout
    assert _left_behind(mark) == []


# The CLI leaves no process behind at a normal end: tests/ps/test_user_job.py; Ctrl-C: make test-full.
@pytest.mark.full
@pytest.mark.timeout(240)
def test_ctrl_c_stops_the_run_and_ray(tmp_path):
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "trainscale", "ps", "--mode", "async", "--learners", "1",
                             "--time", "300", "--delay", "exp:0.05", "--model.width", "32", "--log.progress", "lines",
                             "--log.every", "1"], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=_env(mark), cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        for line in proc.stderr:  # wait until training is under way
            if line.startswith("update ") or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        # Keep draining both pipes: a run blocked on writing a full pipe could not act on the signal.
        try:
            proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # the run prints its threads' stacks: say where it is stuck
            _, err = proc.communicate(timeout=20)
            pytest.fail("no exit within 90 s of Ctrl-C; its stacks:\n" + err[-6000:])
        rc = proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 130
    assert _left_behind(mark) == []
