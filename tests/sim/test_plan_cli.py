"""``trainscale plan`` as a user runs it: bad input, the pinned JSON, and one tiny calibrate + plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clitools import run_cli

SEED_TOPO = str(Path(__file__).parent / "seed000_topo.txt")
P40 = ["plan", "--model", "se_resnext152", "--samples-per-s-1", "23.33", "--batch-size", "40", "--gpu", "P40",
       "--gpus-per-node", "8"]


@pytest.mark.parametrize("args,expect", [
    (["--gpu", "Z80", "--params", "1000", "--samples-per-s-1", "10", "--batch-size", "4"], "unknown GPU; one of P40"),
    (["--gpu", "V100", "--inter", "5g", "--params", "1000", "--samples-per-s-1", "10", "--batch-size", "4"],
     "--inter = '5g': unknown link; one of"),
    (["--gpu", "V100", "--world-size", "12", "--params", "1000", "--samples-per-s-1", "10", "--batch-size", "4"],
     "--world-size = 12: does not divide into nodes of 8 devices"),
    (["--gpu", "V100", "--topo", "README.md", "--params", "1000", "--samples-per-s-1", "10", "--batch-size", "4"],
     "--topo = 'README.md': no header line naming GPU0"),
])
def test_bad_input_one_line_nothing_written(tmp_path, args, expect):
    out = tmp_path / "plan"
    r = run_cli(["plan", *args, "--out", str(out), "--json", str(tmp_path / "p.json")], timeout=60)
    assert r.rc == 2
    lines = [ln for ln in r.err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and expect in lines[0], r.err
    assert not out.exists() and not (tmp_path / "p.json").exists()


def test_seed000_json_shape_and_doctor_verdict(tmp_path):
    r = run_cli([*P40, "--world-size", "1,4,8", "--topo", SEED_TOPO, "--measured", "4:3.15,8:4.79",
                 "--out", str(tmp_path / "plan"), "--json", str(tmp_path / "p.json")], timeout=60)
    assert r.rc == 0, r.err
    doc = json.loads((tmp_path / "p.json").read_text())
    keys = {"world_size", "step_time_s", "samples_per_s", "speedup", "efficiency", "comm_exposed_s", "bound"}
    assert [p["world_size"] for p in doc["points"]] == [1, 4, 8] and keys <= set(doc["points"][0])
    assert "PXB" in doc["assumptions"]["topology"]
    assert "communication does not explain the gap" in r.out and "trainscale doctor" in r.out
    for f in ("plan.json", "plan.md", "plan.html", "plan-throughput.png", "plan-breakdown.png"):
        assert (tmp_path / "plan" / f).is_file()


@pytest.mark.timeout(300)
def test_calibrate_then_plan_tiny_job(tmp_path):
    cal = tmp_path / "cal.json"
    train = ["--model", "mlp", "--data", "digits", "--steps", "12", "--log.skip_first", "2"]
    r = run_cli(["plan", "calibrate", "--nproc", "2", "--interference", "--out", str(cal), *train], timeout=240)
    assert r.rc == 0, r.err
    data = json.loads(cal.read_text())
    assert data["allreduce"]["2"]["alpha"] >= 0 and "residual" in data["allreduce"]["2"]
    # --interference: the job ran on 2 ranks without the exchange, and the skeleton spun its CPU per step
    inf, one = data["inflation"]["2"], data["single"][str(max(1, data["cores"] // 2))]  # a rank's threads
    assert len(inf["rank_cpu_s"]) == 2 and inf["ratio"] == pytest.approx(inf["cpu_s"] / inf["single_cpu_s"])
    assert inf["factor"] == max(1.0, inf["ratio"])
    rep = data["replay"]["2"]
    # DDP's reducer, measured at a rank's threads (the 1-process run is the bare module): spun after the exchange
    red = data["reducer"][str(one["threads"])]
    assert red["cpu_s"] > 0 and red["unit"] == "s per step" and "sim/reducer.py" in red["source"]
    assert rep["spin_cpu_s"] == pytest.approx(one["cpu_s"] * inf["factor"] + red["cpu_s"] / one["threads"])
    # the skeleton ran the same steps on both ranks, each no shorter than the CPU it spins
    assert rep["steps"] >= 8 and rep["step_s"] >= rep["spin_cpu_s"]
    assert sum("--ablate.comm true" in c for c in data["commands"]) == 2  # at 1 and at 2 processes, alike
    # what the CPU-host model stands on: Gloo's CPU per all-reduce, the core share at P, CPU seconds per step
    assert data["allreduce"]["2"]["cpu_alpha"] >= 0 and data["allreduce"]["2"]["cpu_beta"] >= 0
    assert 0 < data["share"]["2"] <= 1.0 and all(v["cpu_s"] > 0 for v in data["single"].values())
    r = run_cli(["plan", "--calibration", str(cal), "--nproc", "1,2", "--json", str(tmp_path / "p.json"),
                 "--out", str(tmp_path / "plan"), *train], timeout=60)
    assert r.rc == 0, r.err
    plan = json.loads((tmp_path / "p.json").read_text())
    pts = plan["points"]
    assert [p["world_size"] for p in pts] == [1, 2] and pts[1]["step_time_s"] > 0
    assert plan["assumptions"]["compute_inflation"] == {"2": round(inf["factor"], 4)}
    assert {t["name"]: t["value"] for t in plan["assumptions"]["terms"]}["reducer_cpu_s"] == round(red["cpu_s"], 6)
    # the same calibration refuses another job
    r = run_cli(["plan", "--calibration", str(cal), "--nproc", "1,2", "--out", str(tmp_path / "p2"),
                 "--model", "resnet18"], timeout=60)
    assert r.rc == 2 and "measured another job" in r.err and not (tmp_path / "p2").exists()


def test_bench_refuses_another_jobs_calibration(tmp_path):
    from trainscale.sim.calibration import Calibration

    cal = tmp_path / "cal.json"
    Calibration({"model.name": "mlp", "data.batch_size": 32}, [], 10, [40.0], 0.0, 1.0, 2,
                {"2": {"step_s": 0.01, "compute_s": 0.008}}).save(cal)
    r = run_cli(["bench", "--nproc", "1,2", "--calibration", str(cal), "--out", str(tmp_path / "b"),
                 "--model", "resnet18"], timeout=60)
    assert r.rc == 2 and "measured another job" in r.err and not (tmp_path / "b").exists()
