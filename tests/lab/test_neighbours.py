"""The doctor's view of the machine outside the job: every outside process's CPU counts, and work that ends while
the doctor watches counts under the process that started it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainscale.lab.neighbours import LoadMonitor, describe

# Outside the test's process tree: waits for ``.go``, runs six children that each burn 0.3 s of CPU one after
# another, writes the CPU its children used, then stays until ``.stop`` (and never past 120 s, so that a test that
# failed early leaves nothing behind).
STARTER = """
import os, subprocess, sys, time
out = sys.argv[1]
give_up = time.monotonic() + 120
open(out + ".tmp", "w").write(str(os.getpid()))
os.replace(out + ".tmp", out + ".pid")
burn = "import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass"
while not os.path.exists(out + ".go"):
    time.sleep(0.01)
    if time.monotonic() > give_up:
        sys.exit(1)
for _ in range(6):
    subprocess.run([sys.executable, "-c", burn], check=True)
t = os.times()
open(out + ".tmp", "w").write(str(t.children_user + t.children_system))
os.replace(out + ".tmp", out)
while not os.path.exists(out + ".stop") and time.monotonic() < give_up:
    time.sleep(0.01)
"""


def _wait_for(path: Path, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.01)


@pytest.mark.timeout(90)
def test_processes_that_ended_count_under_the_process_that_started_them(tmp_path):
    out = tmp_path / "cpu"
    # Started through a shell that exits at once: the starter is no child of this test, so it is outside the job.
    subprocess.run(["sh", "-c", '"$0" -c "$1" "$2" >/dev/null 2>&1 &', sys.executable, STARTER, str(out)],
                   check=True)
    starter = 0
    try:
        _wait_for(Path(f"{out}.pid"), 30)
        starter = int(Path(f"{out}.pid").read_text())
        with LoadMonitor(interval_s=0.1, min_cores=0.2) as m:
            Path(f"{out}.go").touch()
            _wait_for(out, 60)
    finally:
        Path(f"{out}.stop").touch()
        time.sleep(0.05)
        if starter:
            with contextlib.suppress(ProcessLookupError):
                os.kill(starter, signal.SIGKILL)
    rep, children_cpu = m.report(), float(out.read_text())
    # Each child alone is under min_cores: reported one by one, none would show and the load would read as none.
    assert children_cpu / 6 / rep["seconds"] < 0.2
    row = next(r for r in rep["top"] if r["pid"] == starter)
    assert row["ended"] == 6
    # The starter waited for each child: the kernel's children times count them whole, however the samples fell.
    assert 0.95 * children_cpu <= row["cores"] * rep["seconds"] <= 1.2 * children_cpu + 0.5
    assert rep["cores"] >= row["cores"]
    assert describe(row).startswith("python") and f"pid {starter} and 6 processes it started, " in describe(row)
