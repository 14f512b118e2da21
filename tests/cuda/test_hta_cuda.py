"""Holistic Trace Analysis on a real CUDA trace: its temporal breakdown covers the steps the summary measured.

Skipped without CUDA or without HTA (``pip install 'trainscale[trace]'``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clitools import FAST, read_json, run_cli

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# HTA splits the span from a rank's first GPU kernel to its last into compute, communication and idle time. The
# profiled steps are the measured ones, so that span is the measured steps less what runs on the host before the
# first kernel of the first step and after the last kernel of the last: under a step in all. With 30 measured
# steps that is under 4%; the tolerance leaves room for a step longer than the median.
TOLERANCE = 0.15

HTA_BREAKDOWN = """
import json, sys
from hta.trace_analysis import TraceAnalysis
tb = TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
cols = ["rank", "idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)"]
print(json.dumps([{c: float(row[c]) for c in cols} for _, row in tb.iterrows()]))
"""


@pytest.mark.timeout(400)
def test_hta_temporal_breakdown_agrees_with_the_summary_step_time(tmp_path):
    pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is not installed")
    tiny = ["--model", "resnet18", "--model.width", "8", "--data", "synthetic", "--data.image_size", "32", *FAST]
    r = run_cli(["train", "--steps", "32", *tiny, "--profile", "--json", str(tmp_path / "s.json")], timeout=300)
    assert r.rc == 0, r.text
    s = read_json(tmp_path / "s.json")
    assert s["device"] == "cuda" and s["profile_traces"]
    # HTA rounds kernel starts up and ends down to the microsecond: a kernel under 1 us gets a negative length and
    # its breakdown fails an assertion (seen on an H200); the variable keeps the trace's nanoseconds.
    env = {**os.environ, "HTA_DISABLE_NS_ROUNDING": "1"}
    h = subprocess.run([sys.executable, "-c", HTA_BREAKDOWN, str(Path(s["profile_traces"][0]).parent)],
                       capture_output=True, text=True, timeout=240, env=env)
    assert h.returncode == 0, h.stderr[-2000:]
    (rank0,) = json.loads(h.stdout.strip().splitlines()[-1])
    parts = rank0["idle_time(us)"] + rank0["compute_time(us)"] + rank0["non_compute_time(us)"]
    assert parts == pytest.approx(rank0["kernel_time(us)"], rel=1e-6)  # HTA's three parts tile its span
    measured = s["measured_steps"] * s["step_time_s"]
    ratio = rank0["kernel_time(us)"] / 1e6 / measured
    print(f"HTA kernel span {rank0['kernel_time(us)'] / 1e6:.4f} s (compute {rank0['compute_time(us)'] / 1e6:.4f}, "
          f"communication {rank0['non_compute_time(us)'] / 1e6:.4f}, idle {rank0['idle_time(us)'] / 1e6:.4f}) "
          f"against {s['measured_steps']} measured steps x {s['step_time_s'] * 1e3:.2f} ms = {measured:.4f} s: "
          f"ratio {ratio:.3f}")
    assert abs(ratio - 1) <= TOLERANCE, ratio
    assert rank0["compute_time(us)"] > 0
