"""Trainer flags the lab is built on: ablations, per-rank compute times, profile, injected faults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clitools import FAST, read_json, run_cli

HERE = Path(__file__).parent
TINY = [*FAST, "--data", "synthetic", "--data.image_size", "8", "--data.channels", "1", "--data.train_size", "256",
        "--data.eval_size", "32", "--job.threads", "1"]


@pytest.mark.dist
@pytest.mark.timeout(240)
@pytest.mark.parametrize("ablate,extra,equal", [
    # The control (weights equal under DDP) and the phased no_comm block stay; the whole run ablated: make test-full.
    ("false", [], True), pytest.param("true", [], False, marks=pytest.mark.full),
    # steps 1-2 base, 3-4 no_comm, 5 base: the no_comm block really drops the exchange, so replicas part
    ("false", ["--ablate.phases", "base,no_comm", "--ablate.phase_steps", "2"], False),
], ids=["ddp", "ablate-comm", "phases"])
def test_ablate_comm_means_no_gradient_exchange(ablate, extra, equal):
    r = run_cli(["launch", "--nproc-per-node", "2", str(HERE / "ablate_comm_script.py"), ablate, *extra],
                timeout=200)
    assert r.rc == 0, r.text
    assert f"WEIGHTS_EQUAL={equal}" in r.text


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_phases_time_each_ablation_inside_one_run(tmp_path):
    out = tmp_path / "p.json"
    r = run_cli(["train", "--nproc", "2", *TINY, "--steps", "25", "--log.skip_first", "1", "--json", str(out),
                 "--ablate.phases", "base,no_data,no_comm", "--ablate.phase_steps", "4"], timeout=200)
    assert r.rc == 0, r.text
    s = read_json(out)
    ph = s["phases"]
    assert list(ph) == ["base", "no_data", "no_comm"]
    # 2 cycles of blocks of 4; the first 2 steps of a block (1 + data.prefetch 2, capped at half) are not timed
    assert all(p["measured_steps"] == 4 for p in ph.values()), ph
    assert all(len(p["rank_compute_s"]) == 2 and len(p["rank_step_time_s"]) == 2 for p in ph.values())
    assert ph["no_data"]["data_wait_frac"] < 0.01 and ph["no_comm"]["data_wait_frac"] < 0.01
    assert s["measured_steps"] == 24


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,needle", [
    (["--ablate.phases", "base,warp"], "ablate.phases = 'base,warp': two or more distinct names from base, no_data"),
    (["--ablate.phases", "base,no_comm", "--ablate.data", "true"], "leave ablate.comm, ablate.data"),
    (["--ablate.phases", "base,no_comm", "--steps", "10"], "job.steps = 10: too few for ablate.phases"),
])
def test_bad_phases_are_one_line(args, needle):
    r = run_cli(["train", *args], timeout=50)
    assert r.rc == 2, r.text
    assert needle in r.err and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_sleep_test_straggler_and_profile(tmp_path):
    out = tmp_path / "s.json"
    r = run_cli(["train", "--nproc", "2", *TINY, "--steps", "16", "--ablate.compute", "sleep",
                 "--ablate.calibrate_steps", "3", "--job.slow_rank", "1", "--job.slow_factor", "4", "--profile",
                 "--json", str(out)], timeout=200)
    assert r.rc == 0, r.text
    s = read_json(out)
    assert s["ablate"]["compute"] == "sleep" and s["calibrated_compute_s"] > 0
    assert s["measured_steps"] == 16 - 3 - 1  # calibration and warm-up excluded from timings
    assert len(s["rank_compute_s"]) == 2 and s["rank_compute_s"][1] > 1.5 * s["rank_compute_s"][0]
    assert "sleep test: 6/6 leaf modules replaced" in r.text  # mlp: flatten, 2x (linear, relu), linear
    prof = json.loads(Path(s["profile_json"]).read_text())
    assert prof["world_size"] == 2 and prof["steps"] > 0 and prof["ops"]
    assert Path(s["profile_table"]).read_text().startswith("# rank 0")


@pytest.mark.timeout(120)
def test_sample_delay_and_import_path_model(tmp_path):
    out = tmp_path / "d.json"
    r = run_cli(["train", *TINY, "--steps", "8", "--data.sample_delay_ms", "2", "--batch-size", "8",
                 "--model.name", "planted_models:slow_op_mlp", "--json", str(out)], timeout=100,
                env={"PYTHONPATH": f"{HERE}:{Path(__file__).parents[2] / 'src'}"})
    assert r.rc == 0, r.text
    s = read_json(out)
    assert s["data_wait_frac"] > 0.3  # 8 samples x 2 ms per step dominate a tiny model's step
    assert s["model"] == "planted_models:slow_op_mlp"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,needle", [
    (["--ablate.compute", "nap"], "ablate.compute = 'nap': one of none, sleep"),
    (["--ablate.everything", "true"], "unknown field of [ablate]"),
    (["--model.name", "no_such_module:build"], "cannot import no_such_module"),
    (["--ablate.compute", "sleep", "--steps", "4"], "job.steps = 4: must exceed"),
])
def test_bad_ablation_input_is_one_line(args, needle):
    r = run_cli(["train", *args], timeout=50)
    assert r.rc != 0
    assert needle in r.err and "Traceback" not in r.err
