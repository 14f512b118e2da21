"""Helpers of the survival tests: a job in its own session, killed as a group whatever happens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from clitools import still_running

REPO = Path(__file__).resolve().parents[2]
# 1,500 digits / (2 x 16) = 47 steps per epoch: 40 steps, a checkpoint every 10.
JOB = ["--model", "mlp", "--model.width", "32", "--data", "digits", "--batch-size", "16", "--steps", "40",
       "--checkpoint.every", "10", "--log.progress", "lines", "--log.every", "5", "--log.skip_first", "1"]


@dataclass
class Done:
    rc: int
    text: str
    wall_s: float
    left: list[int]  # processes of the job's session still alive after it ended


def start(args: list[str], fault: str = "") -> subprocess.Popen:
    """``trainscale ARGS`` in a new session (so the test can end every process of it)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RANK", None)
    if fault:
        env["TRAINSCALE_FAULT"] = fault
    return subprocess.Popen([sys.executable, "-m", "trainscale", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO, start_new_session=True)


def session_pids(sid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.info["pid"]) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.info["pid"])
        except (ProcessLookupError, psutil.Error, OSError):
            pass
    return out


def finish(p: subprocess.Popen, timeout: float) -> Done:
    """Wait for the job; past ``timeout`` kill it (and fail the caller's assertion on rc).

    ``left``: processes of the job still alive after it ended, among its session and every process seen under
    it while it ran (torchrun starts each rank in a session of its own)."""
    t0 = time.monotonic()
    seen: set[psutil.Process] = set()
    out = ""
    while True:
        try:
            seen |= set(psutil.Process(p.pid).children(recursive=True))
        except psutil.Error:
            pass
        try:
            out, _ = p.communicate(timeout=0.2)  # a retry after the timeout loses no output
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() - t0 > timeout:
                for q in [*seen, psutil.Process(p.pid)]:
                    _kill(q)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                out, _ = p.communicate()
                out += f"\n[test] killed after {timeout} s"
                break
    time.sleep(0.5)  # reaped children disappear from the table
    left = set(session_pids(p.pid)) | {q.pid for q in still_running(seen)}
    for pid in left:  # never leave a process behind, whatever the verdict
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return Done(p.returncode, out, time.monotonic() - t0, sorted(left))


def _kill(q: psutil.Process) -> None:
    try:
        q.kill()
    except psutil.Error:
        pass


def run(args: list[str], timeout: float = 180, fault: str = "") -> Done:
    return finish(start(args, fault), timeout)


def wait_for(path: Path, p: subprocess.Popen, timeout: float) -> float:
    """Wait until ``path`` exists (or the job ended); return the monotonic time it appeared."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and p.poll() is None:
        if path.exists():
            return time.monotonic()
        time.sleep(0.02)
    return time.monotonic()


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
