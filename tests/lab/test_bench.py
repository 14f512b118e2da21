"""``trainscale bench``: files, the efficiency formula from its own JSON, partial results on a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from clitools import read_json, run_cli

HERE = Path(__file__).parent


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_default_job_writes_report_and_consistent_efficiency(tmp_path):
    out = tmp_path / "bench"
    r = run_cli(["bench", "--nproc", "1,2", "--repeat", "1", "--out", str(out), "--steps", "40",
                 "--job.threads", "1"], timeout=280)
    assert r.rc == 0, r.text
    # not a terminal (a batch job's log): one line per run done, none before the first ends
    said = [ln for ln in r.err.splitlines() if ln.startswith("bench: ")]
    assert len(said) == 2 and said[0].startswith("bench: 1/2 runs, ") and "next: 2 process(es)" in said[0], r.err
    for name in ("bench.json", "report.md", "report.html", "throughput.png", "efficiency.png", "breakdown.png",
                 "ranks.png", "timeline.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    # Each run's live metrics in a folder of its own (its job.out), none shared.
    assert not (out / "runs" / "metrics.jsonl").exists()
    curves = [(out / "runs" / n / "metrics.jsonl").read_text() for n in ("n1_r0", "n2_r0")]
    assert all(curves) and curves[0] != curves[1]
    doc = read_json(out / "bench.json")
    md = (out / "report.md").read_text()
    v = doc["verdict"]
    assert md.split("\n\n")[1].startswith(f"Verdict: Efficiency at 2 processes: {v['efficiency']:.0%} ")
    assert v["word"] in md.split("\n\n")[1]
    if v["efficiency"] < 1:  # the next command, to copy
        assert f"```\n{v['doctor_command']}\n```" in md and v["doctor_command"].startswith("trainscale doctor")
    assert "scaling overhead" in md and "comm overhead" not in md
    pts = {p["nproc"]: p for p in doc["points"]}
    assert set(pts) == {1, 2}
    one = pts[1]["samples_per_s"]
    for n, p in pts.items():
        assert p["efficiency"] == pytest.approx(p["samples_per_s"] / (n * one), rel=1e-9)
        assert p["speedup"] == pytest.approx(p["samples_per_s"] / one, rel=1e-9)
        assert p["comm_overhead_s"] == pytest.approx(p["step_time_s"] - pts[1]["step_time_s"], rel=1e-9)
        for key in ("data_wait_frac", "step_time_s", "spread"):
            assert key in p
    assert pts[2]["global_batch"] == 2 * pts[1]["global_batch"]  # weak scaling: fixed per-device batch
    assert "data:image/png;base64," in (out / "report.html").read_text()
    assert "efficiency" in r.out and "samples/s" in r.out


@pytest.mark.full  # a crashing job's partial results and its log: tests/lab/test_lab_scripts.py::test_bad_scripts_are_clear_errors
@pytest.mark.dist
@pytest.mark.timeout(240)
def test_crashing_job_stops_sweep_and_keeps_partial_results(tmp_path):
    out = tmp_path / "bench"
    r = run_cli(["bench", "--nproc", "1,2,4", "--repeat", "1", "--out", str(out), "--steps", "8",
                 "--model.name", "planted_models:crash_when_distributed", "--data", "synthetic",
                 "--data.image_size", "8", "--data.eval_size", "16", "--job.threads", "1"], timeout=220,
                env={"PYTHONPATH": f"{HERE}:{Path(__file__).parents[2] / 'src'}"})
    assert r.rc == 1
    assert "planted crash" in r.err and "sweep stopped" in r.err
    doc = read_json(out / "bench.json")
    assert [p["nproc"] for p in doc["points"]] == [1]
    assert doc["error"]["nproc"] == 2 and "planted crash" in doc["error"]["message"]
    assert (out / "report.md").is_file()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,needle", [
    (["bench", "--nproc", "0"], "--nproc = '0': comma-separated process counts >= 1"),
    (["bench", "--nproc", "1,x"], "comma-separated process counts"),
    (["bench", "--ablate.compute", "nap"], "ablate.compute = 'nap'"),
    (["bench", "--json", "x.json"], "set by the lab itself"),
    (["bench", "--job.out", "shared"], "--job.out = '--job.out': set by the lab itself for each run"),
    (["bench", "--scaling", "strong", "--nproc", "1,3", "--batch-size", "32"], "must divide by every world size"),
    (["doctor", "--nproc", "1"], "give N >= 2"),
])
def test_lab_bad_input_is_one_line(tmp_path, args, needle):
    r = run_cli([*args, "--out", str(tmp_path / "o")] if args[0] == "bench" else args, timeout=50)
    assert r.rc == 2, r.text
    assert needle in r.err and "Traceback" not in r.err
    assert not (tmp_path / "o" / "bench.json").exists()
