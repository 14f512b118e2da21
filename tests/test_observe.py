"""Seeing where the time goes: the per-rank timeline, live metrics (metrics.jsonl, TensorBoard, MLflow),
and a summary that validates against the shipped schema."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time

import jsonschema
import pytest

from clitools import FAST, REPO, read_json, run_cli
from summaries import check_summary_file


def _phase_totals(trace: dict, rank: int) -> tuple[list[float], dict[int, float]]:
    """Durations of rank's step spans and, per step, the sum of its phase spans (seconds)."""
    ev = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == rank]
    steps = [e["dur"] / 1e6 for e in ev if e["cat"] == "step"]
    per_step: dict[int, float] = {}
    for e in ev:
        if e["cat"] == "phase":
            per_step[e["args"]["step"]] = per_step.get(e["args"]["step"], 0.0) + e["dur"] / 1e6
    return steps, per_step


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """One 2-process run with every instrument of this file on: timeline, profiler traces, TensorBoard."""
    tmp_path = tmp_path_factory.mktemp("observe")
    out = tmp_path / "s.json"
    r = run_cli(["train", "--nproc", "2", "--steps", "30", *FAST, "--json", str(out), "--timeline", "--profile",
                 "--log.tracker", "tensorboard"], timeout=200)
    assert r.rc == 0, r.text
    return tmp_path, read_json(out)  # strict and schema-checked


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_two_process_timeline_metrics_tensorboard_and_schema(two_process_run):
    tmp_path, s = two_process_run
    assert s["versions"]["torch"] and s["host"] and s["started_at"]
    trace = json.loads((tmp_path / "timeline.json").read_text())
    assert s["timeline"] == str(tmp_path / "timeline.json")
    names = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "phase"}
    assert {"data wait", "forward+backward", "exposed communication", "optimizer"} <= names
    for rank in range(2):
        steps, per_step = _phase_totals(trace, rank)
        assert len(steps) == s["measured_steps"] == len(per_step)
        # The spans of each rank add up to its measured step time (the summary's median, within 5%).
        measured = s["rank_step_time_s"][rank]
        assert abs(statistics.median(per_step.values()) - measured) <= 0.05 * measured
        assert abs(sum(per_step.values()) - sum(steps)) <= 0.05 * sum(steps)
    # metrics.jsonl: one line per log point (every 5 steps), the values of the summary's loss curve.
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [p[0] for p in s["loss_curve"]] == list(range(5, 31, 5))
    assert all(x["samples_per_s"] > 0 and x["step_time_s"] > 0 and x["data_wait_s"] >= 0 for x in lines)
    assert lines[-1]["loss"] == pytest.approx(s["loss_curve"][-1][2])
    # TensorBoard's own reader gets the same points back.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [x["step"] for x in lines]
    assert [e.value for e in loss] == pytest.approx([x["loss"] for x in lines], rel=1e-6)
    assert "samples_per_s" in acc.Tags()["scalars"]


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_profiler_traces_load_in_holistic_trace_analysis(two_process_run):
    """--profile leaves one trace per rank that HTA reads: every measured step, per rank, split in time.

    HTA's own temporal breakdown splits a rank's time between its GPU kernels (compute, communication, idle);
    a CPU run has no kernels, so there the split is taken from HTA's parsed per-rank frames: each profiled
    step's time inside Gloo's all-reduce and outside it. HTA runs in a process of its own, as a user runs it:
    it parses ranks in forked workers, and a fork of this test process (where earlier tests left Ray's threads)
    can deadlock.
    """
    pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is not installed: "
                        "pip install 'trainscale[trace]'")
    tmp_path, s = two_process_run
    assert s["profile_traces"] == [str(tmp_path / "traces" / f"trace_rank{r}.json") for r in range(2)]
    r = subprocess.run([sys.executable, "-c", HTA_READ, str(tmp_path / "traces"), s["device"]], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    trace = json.loads((tmp_path / "timeline.json").read_text())
    assert got["ranks"] == [0, 1]
    # Every measured step is a profiler step (the span still open when the profiler stopped is left out).
    assert got["profiler_steps"] == s["measured_steps"]
    if s["device"] == "cuda":
        assert got["kernel_ranks"] == [0, 1] and got["kernels_busy"]
        return
    for rank, (step_us, calls, comm_us) in enumerate(got["per_rank"]):
        assert len(step_us) == s["measured_steps"] and calls >= len(step_us)  # one bucket or more per step
        # Each step in HTA's trace is the step the run measured (its timeline's step spans, which add up to the
        # summary's: the test above), paired step by step, so a step a busy host slowed is slow in both. (Medians
        # compared apart differed by 12% once: 20 steps of two modes, and the instruments' work at a step's end
        # falls in the profiler's step and in the clock's next one.) The all-reduce is a real part of the step.
        timeline = sorted((e for e in trace["traceEvents"]
                           if e["ph"] == "X" and e["pid"] == rank and e["cat"] == "step"), key=lambda e: e["ts"])
        assert len(timeline) == len(step_us)
        ratios = [us / e["dur"] for us, e in zip(step_us, timeline)]
        assert abs(statistics.median(ratios) - 1) <= 0.05, ratios
        assert 0 < comm_us < statistics.median(step_us)


# What a user runs on the traces: HTA's TraceAnalysis; prints the numbers the test checks as one JSON line.
HTA_READ = """
import json, sys
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
out = {"ranks": sorted(ta.t.traces), "profiler_steps": len(ta.get_profiler_steps())}
if sys.argv[2] == "cuda":
    tb = ta.get_temporal_breakdown(visualize=False)
    out.update(kernel_ranks=sorted(int(r) for r in tb["rank"]), kernels_busy=bool((tb["kernel_time(us)"] > 0).all()))
else:
    sym = ta.t.symbol_table.get_sym_table()
    out["per_rank"] = []
    for rank in out["ranks"]:
        df = ta.t.get_trace(rank)
        names = df["name"].map(lambda i: sym[i])
        steps, comm = df[names.str.startswith("ProfilerStep#")], df[names == "gloo:all_reduce"]
        out["per_rank"].append([[float(d) for d in steps.sort_values("ts")["dur"]], len(comm),
                                float(comm.groupby("iteration")["dur"].sum().median())])
print(json.dumps(out))
"""


@pytest.mark.timeout(180)
def test_killed_run_keeps_its_metrics(tmp_path):
    """A run killed at step ~50 of 100 leaves metrics.jsonl with its log points up to there, each line whole."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RANK", None)
    cmd = [sys.executable, "-m", "trainscale", "train", "--steps", "100", "--log.every", "5", "--log.progress", "none",
           "--data.sample_delay_ms", "3", "--job.out", str(tmp_path)]
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = tmp_path / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and p.poll() is None:
            if path.is_file() and any(json.loads(x)["step"] >= 50 for x in path.read_text().splitlines() if x):
                break
            time.sleep(0.05)
        assert p.poll() is None, "the run ended before step 50: nothing to kill"
        p.send_signal(signal.SIGKILL)
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps[:10] == list(range(5, 51, 5)) and steps[-1] < 100
    assert all(math.isfinite(r["loss"]) for r in rows)
    assert not (tmp_path / "s.json").exists()


@pytest.mark.timeout(120)
def test_mlflow_local_store_round_trip(tmp_path):
    """log.tracker mlflow: a local file store that MLflow's own client reads back."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from trainscale.config import Config, config_to_dict
    from trainscale.train.report.metrics import MetricsLog

    log = MetricsLog(tmp_path, "mlflow", tmp_path, config_to_dict(Config()), run_name="roundtrip")
    for step, loss in ((5, 2.5), (10, 1.25), (15, float("nan"))):
        log.log(step, {"loss": loss, "samples_per_s": 1000.0 + step})
    log.close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = client.search_runs([client.get_experiment_by_name("trainscale").experiment_id])[0]
    assert run.info.run_name == "roundtrip" and run.info.status == "FINISHED"
    assert run.data.params["strategy.bucket_mb"] == "25.0"
    hist = client.get_metric_history(run.info.run_id, "samples_per_s")
    assert sorted((m.step, m.value) for m in hist) == [(5, 1005.0), (10, 1010.0), (15, 1015.0)]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["loss"] for x in lines] == [2.5, 1.25, None]  # NaN as null: strict JSON


def test_timeline_spans_tile_each_step():
    from trainscale.train.instruments.timeline import build_trace

    # step, t0, wait, forward start, compute, step() called, optimizer starts, end
    fast = [(4, 10.0, 0.001, 10.0015, 0.004, 10.008, 10.009, 10.010)]
    slow = [(4, 10.0, 0.0, 10.0001, 0.007, 10.0085, 10.009, 10.0101)]
    trace = build_trace([fast, slow])
    for rank, row in enumerate((fast[0], slow[0])):
        steps, per_step = _phase_totals(trace, rank)
        assert per_step[4] == pytest.approx(row[7] - row[1], rel=1e-6) == pytest.approx(steps[0], rel=1e-6)
    waits = {e["pid"]: e["dur"] for e in trace["traceEvents"] if e.get("name") == "waiting for slowest rank"}
    assert waits == {0: pytest.approx(3000.0)}  # rank 0 waited 7 - 4 ms for rank 1's compute


def test_summary_strict_json_and_nan_round_trip(tmp_path_factory):
    from trainscale.train.summary import read_summary, write_summary

    tmp_path = tmp_path_factory.mktemp("partial")  # not tmp_path: the suite-wide check would reject it too

    base = {"schema_version": 2, "world_size": 1, "loss_curve": [[5, 0.1, float("nan")]],
            "eval_loss": float("nan"), "rank_compute_s": [float("inf"), 0.5], "note": "x"}
    write_summary(tmp_path / "s.json", base)
    text = (tmp_path / "s.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    back = read_summary(tmp_path / "s.json")
    assert math.isnan(back["eval_loss"]) and math.isnan(back["loss_curve"][0][2])
    assert math.isnan(back["rank_compute_s"][0]) and back["rank_compute_s"][1] == 0.5 and back["note"] == "x"
    with pytest.raises(jsonschema.ValidationError):
        check_summary_file(tmp_path / "s.json")  # required fields missing: the schema says so


def test_human_numbers():
    from trainscale.train.summary import human

    assert human(15260.4, "samples/s") == "15,260 samples/s"
    assert human(0.003491, "s") == "3.49 ms"
    assert human(2.5, "s") == "2.5 s"
    assert human(0.423, "%") == "42.3%"
    assert human(float("nan")) == "-" and human(None) == "-"
