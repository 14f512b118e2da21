"""A lab command that ends early (its run timed out, or the lab got SIGTERM) leaves no rank behind.

torchrun starts each rank in a session of its own, so ending the launcher's process group is not enough."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from clitools import still_running

pytestmark = pytest.mark.dist

DOCTOR = [sys.executable, "-m", "trainscale", "doctor", "--nproc", "2", "--quick", "--data", "synthetic",
          "--data.image_size", "8", "--steps", "30"]


def _watch(p: subprocess.Popen, until: float, stop_when_ranks: bool) -> set[psutil.Process]:
    """Every process seen under ``p`` until it exits (or, with ``stop_when_ranks``, until ranks are running)."""
    seen: set[psutil.Process] = set()
    while p.poll() is None and time.monotonic() < until:
        try:
            kids = psutil.Process(p.pid).children(recursive=True)
        except psutil.Error:
            break
        seen |= set(kids)
        if stop_when_ranks and sum("-u" in k.cmdline() for k in kids if k.is_running()) >= 2:
            break
        time.sleep(0.2)
    return seen


def _left(seen: set[psutil.Process]) -> list[str]:
    time.sleep(1)
    return [" ".join(q.cmdline()) for q in still_running(seen)]


@pytest.mark.timeout(120)
def test_sigterm_to_the_doctor_ends_the_run_in_flight(tmp_path):
    p = subprocess.Popen([*DOCTOR, "--out", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        seen = _watch(p, time.monotonic() + 60, stop_when_ranks=True)
        assert seen, "the doctor started no run"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 130 and "interrupted" in err, err
    assert not _left(seen)


@pytest.mark.timeout(120)
def test_a_run_past_its_timeout_is_ended_with_every_rank(tmp_path):
    # 8 s: enough for the launcher to start its ranks (about 3 s on a quiet machine), not for them to finish.
    p = subprocess.Popen([sys.executable, "-m", "trainscale", "bench", "--nproc", "2", "--repeat", "1", "--timeout",
                          "8", "--out", str(tmp_path), "--data", "synthetic", "--steps", "100000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = _watch(p, time.monotonic() + 90, stop_when_ranks=False)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode != 0
    assert "no result within 8s" in out + err, out + err
    assert not _left(seen)
    assert os.path.isfile(tmp_path / "bench.json")  # the error and the failing command are kept
