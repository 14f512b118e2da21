"""DDP's reducer on the local forecast: measured on the job, added at P > 1 only (the bare 1-process step has none)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trainscale.costs.collectives import AlphaBeta
from trainscale.costs.forecast import ClusterSpec, Job, StrategySpec, forecast
from trainscale.sim.calibrate import skeleton
from trainscale.sim.calibration import Calibration

REDUCER = {"s": 0.005, "cpu_s": 0.004, "unit": "s per step", "source": "measured"}


def _host(reducer: dict | None = None) -> Calibration:
    """A 2-core host calibrated at 2 processes (1 thread each), no skeleton: the cost model alone."""
    single = {"1": {"step_s": 0.01, "compute_s": 0.008, "cpu_s": 0.01, "mean_step_s": 0.01, "threads": 1}}
    return Calibration({"model.name": "mlp", "data.batch_size": 32}, [], 10, [4e6], 0.0, 1.0, 2, single,
                       allreduce={"2": {"alpha": 7e-4, "beta": 6e-10, "cpu_alpha": 2e-4, "cpu_beta": 7e-10}},
                       share={"2": 0.9}, reducer={"1": reducer} if reducer else {})


def test_the_reducer_is_added_at_more_than_one_device_only():
    cluster = ClusterSpec(gpus_per_node=2, fitted={2: AlphaBeta(1e-3, 1e-9)})
    bare = Job("j", params=1_000_000, batch_size=10, step_s=0.1, compute_s=0.1, tensor_bytes=[4e6])
    ddp = dataclasses.replace(bare, reducer_cpu_s=0.004)
    a, b = (forecast(j, cluster, StrategySpec(bucket_mb=25, overlap=False), [1, 2]) for j in (bare, ddp))
    assert b[0].step_time_s == a[0].step_time_s  # one device runs the bare module
    assert b[1].step_time_s == pytest.approx(a[1].step_time_s + 0.004)
    # FSDP shards its gradients: no reducer buckets
    fsdp = [forecast(j, cluster, StrategySpec(fsdp_units=2), [2])[0].step_time_s for j in (bare, ddp)]
    assert fsdp[0] == fsdp[1]


def test_a_calibrated_host_forecast_carries_the_measured_reducer_at_p_above_one(tmp_path):
    _host(REDUCER).save(tmp_path / "cal.json")
    cal = Calibration.load(tmp_path / "cal.json")
    assert cal.base_job(2).reducer_cpu_s == 0.004  # the nearest thread count measured
    old = _host()
    worlds = [1, 2, 3]
    with_r, without = (forecast(c.base_job(c.cores), c.cluster(3), StrategySpec(bucket_mb=25), worlds)
                       for c in (cal, old))
    assert with_r[0].step_time_s == without[0].step_time_s
    for p, q in zip(with_r[1:], without[1:]):
        # the reducer's CPU seconds at least (more where ranks share the cores)
        assert p.step_time_s >= q.step_time_s + 0.004 * 0.999, p.world_size


def test_a_calibration_file_without_the_reducer_still_loads_and_adds_nothing(tmp_path):
    doc = dataclasses.asdict(_host(REDUCER))
    del doc["reducer"]
    (tmp_path / "cal.json").write_text(json.dumps(doc))
    cal = Calibration.load(tmp_path / "cal.json")
    assert cal.reducer == {} and cal.base_job(1).reducer_cpu_s == 0.0


def test_the_skeleton_spins_the_reducer_after_the_exchange():
    layout = {"tensor_bytes": [4e6, 4e6], "bucket_mb": 25.0, "overlap": True, "buffer_bytes": 0.0,
              "broadcast_buffers": False}
    single = {"cpu_s": 0.02, "threads": 2, "compute_s": 0.008, "step_s": 0.01}
    a, b = skeleton(layout, single), skeleton(layout, single, reducer_cpu_s=0.004)
    assert b["cpu_s"] == a["cpu_s"] and b["rest_cpu_s"] == pytest.approx(a["rest_cpu_s"] + 0.004 / 2)


def test_plan_json_names_the_reducer_term_with_unit_and_source(tmp_path):
    from trainscale.sim.cli import main

    _host(REDUCER).save(tmp_path / "cal.json")
    assert main(["--calibration", str(tmp_path / "cal.json"), "--nproc", "1,2", "--out", str(tmp_path / "plan"),
                 "--json", str(tmp_path / "p.json")]) == 0
    doc = json.loads((tmp_path / "p.json").read_text())
    term = next(t for t in doc["assumptions"]["terms"] if t["name"] == "reducer_cpu_s")
    assert term["value"] == 0.004 and term["unit"] == "CPU s per step, added at P > 1 only"
    assert "sim/reducer.py" in term["source"]
    assert doc["assumptions"]["reducer"]["1"]["cpu_s"] == 0.004


@pytest.mark.timeout(180)
def test_the_reducer_is_measured_on_the_job():
    from trainscale.sim.reducer import measure

    r = measure(["--model", "mlp", "--data", "digits"], 1, 150, blocks=2, steps=5)
    # DDP's bucket work costs CPU on top of the bare step: a reducer measured as free is wired wrong
    assert r["cpu_s"] > 0 and r["ddp_step_s"] > 0 and r["bare_step_s"] > 0
    assert r["unit"] == "s per step" and "sim/reducer.py" in r["source"] and r["threads"] == 1
