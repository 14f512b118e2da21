"""Forecasts against hand-computed cases and the calibration file's checks."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trainscale.config import ConfigError
from trainscale.costs.collectives import AlphaBeta
from trainscale.costs.forecast import ClusterSpec, Job, StrategySpec, forecast
from trainscale.costs.hardware import gpu, link
from trainscale.sim.calibration import Calibration, fit_alpha_beta


def test_fit_alpha_beta_exact():
    ab, resid = fit_alpha_beta([(0.0, 1e-4), (1e6, 1.1e-3), (2e6, 2.1e-3)])
    assert ab.alpha == pytest.approx(1e-4) and ab.beta == pytest.approx(1e-9) and resid == pytest.approx(0, abs=1e-9)


def test_no_overlap_step_is_compute_plus_allreduce():
    # one bucket of 4 MB, all-reduce measured as 1 ms + 1 ns/B at P=2, compute 100 ms, no noise
    job = Job("j", params=1_000_000, batch_size=10, step_s=0.1, compute_s=0.1, tensor_bytes=[4e6])
    cluster = ClusterSpec(gpus_per_node=2, fitted={2: AlphaBeta(1e-3, 1e-9)})
    p = forecast(job, cluster, StrategySpec(bucket_mb=25, overlap=False), [2])[0]
    assert p.comm_exposed_s == pytest.approx(1e-3 + 4e-3)
    assert p.step_time_s == pytest.approx(0.105)
    assert p.speedup == pytest.approx(2 * 0.1 / 0.105)
    assert p.efficiency == pytest.approx(0.1 / 0.105)


def test_cpu_host_step_is_cpu_demand_at_the_sharing_slowdown():
    # 1-process step: 0.1 s compute + 0.1 s loop, 0.2 CPU s, measured on a free core. At P=4 the probe saw each
    # rank get half a core (slow-down 2); Gloo costs 1 ms of CPU and 1 ms of wall per all-reduce.
    job = Job("j", params=10, batch_size=1, step_s=0.2, compute_s=0.1, tensor_bytes=[40.0], cpu_s=0.2)
    cluster = ClusterSpec(gpus_per_node=4, device="cpu", cores=2, share={4: 0.5}, fitted={4: AlphaBeta(1e-3, 0.0)},
                      comm_cpu={4: AlphaBeta(1e-3, 0.0)})
    p = forecast(job, cluster, StrategySpec(), [4])[0]
    # critical path 0.2 x 2 + 1 ms exposed = 0.401 s; CPU demand (0.2 + 0.001) x 2 = 0.402 s wins
    assert p.step_time_s == pytest.approx(0.402)
    assert p.compute_s == pytest.approx(0.4) and p.comm_exposed_s == pytest.approx(0.002)
    assert p.straggler_s == 0.0 and p.bound == "compute"
    # the same step measured at half a core already (core_share 0.5): compute is not slowed twice
    loaded = Job("j", params=10, batch_size=1, step_s=0.4, compute_s=0.2, tensor_bytes=[40.0], cpu_s=0.2,
                 core_share=0.5)
    assert forecast(loaded, cluster, StrategySpec(), [4])[0].step_time_s == pytest.approx(0.402)
    # no probe at P=4: processor sharing of 4 threads on 2 cores, nobody else (slow-down 2 again)
    cluster.share = {}
    assert forecast(job, cluster, StrategySpec(), [4])[0].step_time_s == pytest.approx(0.402)


def test_a_measured_skeleton_anchors_the_calibrated_strategy_and_scales_the_others():
    # Same host as above (model: 0.402 s at P=4 with 25 MB buckets). The job's skeleton measured 0.5 s there:
    # the forecast of that strategy is the measurement, another strategy keeps the model's ratio to it.
    job = Job("j", params=10, batch_size=1, step_s=0.2, compute_s=0.1, tensor_bytes=[40.0] * 4, cpu_s=0.2)
    cluster = ClusterSpec(gpus_per_node=4, device="cpu", cores=2, share={4: 0.5}, fitted={4: AlphaBeta(1e-3, 0.0)},
                      comm_cpu={4: AlphaBeta(1e-3, 0.0)})
    model_same, model_other = (forecast(job, cluster, StrategySpec(bucket_mb=b), [4])[0] for b in (25, 0))
    cluster.replay = {4: {"step_s": 0.5, "bucket_mb": 25, "overlap": True}}
    same, other = (forecast(job, cluster, StrategySpec(bucket_mb=b), [4])[0] for b in (25, 0))
    assert same.step_time_s == pytest.approx(0.5) and same.model_step_s == pytest.approx(model_same.step_time_s)
    assert same.samples_per_s == pytest.approx(4 * 1 / 0.5)  # 4 ranks x batch 1 per 0.5 s
    assert other.step_time_s == pytest.approx(0.5 * model_other.step_time_s / model_same.step_time_s)
    assert other.step_time_s > same.step_time_s  # one all-reduce per tensor costs more CPU than one bucket
    # a world size without a skeleton stays the model's
    assert forecast(job, cluster, StrategySpec(), [2])[0].model_step_s == 0.0


def test_skeleton_splits_the_measured_cpu_and_readies_buckets_in_backward_order():
    from trainscale.sim.calibrate import _inflation, skeleton

    layout = {"tensor_bytes": [3e6, 1e6, 4e6], "bucket_mb": 4e6 / 1024 / 1024, "overlap": True,
              "buffer_bytes": 8.0, "broadcast_buffers": False}
    single = {"cpu_s": 0.4, "threads": 2, "compute_s": 0.15, "step_s": 0.2}
    sk = skeleton(layout, single)
    # 0.2 CPU s per thread: 3/4 of it forward + backward, the rest after the exchange
    assert sk["cpu_s"] == pytest.approx(0.15) and sk["rest_cpu_s"] == pytest.approx(0.05)
    # a 1 MiB first bucket (DDP's), closed by the first tensor; then 4e6-byte buckets
    assert sk["buckets"] == [3e6, 5e6] and sk["ready"] == pytest.approx([3 / 8, 1.0])
    assert sk["buffer_bytes"] == 0.0  # broadcast_buffers off: nothing broadcast each forward
    assert skeleton({**layout, "overlap": False}, single)["ready"] == [1.0, 1.0]
    # a measured inflation of the job's compute on P ranks (calibrate --interference) scales both parts
    inflated = skeleton(layout, single, 1.25)
    assert inflated["cpu_s"] == pytest.approx(0.1875) and inflated["rest_cpu_s"] == pytest.approx(0.0625)
    # sharing the host never makes the work cheaper: a measured ratio under 1 is noise, the factor stays 1
    assert _inflation([0.9, 1.1], [0.8])["factor"] == pytest.approx(1.25)
    low = _inflation([0.7, 0.9], [1.0])
    assert low["ratio"] == pytest.approx(0.8) and low["factor"] == 1.0


def test_catalog_errors_name_what_is_accepted():
    with pytest.raises(ConfigError, match="--gpu = 'Z80': unknown GPU; one of P40, P100, V100, A100, H100"):
        gpu("Z80")
    with pytest.raises(ConfigError, match="unknown link; one of .*25gbe"):
        link("carrier-pigeon", "--inter")


def test_calibration_from_another_job(tmp_path):
    cal = Calibration({"model.name": "mlp", "data.batch_size": 32}, [], 10, [40.0], 0.0, 1.0, 2,
                      {"2": {"step_s": 0.01, "compute_s": 0.008}})
    path = tmp_path / "cal.json"
    cal.save(path)
    again = Calibration.load(path)
    assert again.params == 10
    with pytest.raises(ConfigError, match="measured another job .model.name = 'mlp', these options give 'resnet18'"):
        again.check_job({"model.name": "resnet18", "data.batch_size": 32}, str(path))
    (tmp_path / "bad.json").write_text('{"points": []}')
    with pytest.raises(ConfigError, match="not a calibration file"):
        Calibration.load(tmp_path / "bad.json")


def test_horovod_setting_within_ten_points():
    """The published Horovod benchmark (benchmarks/results/2026-11-23-plan-published-checks.md lists every assumption)."""
    from trainscale.costs.hardware import known_model
    from trainscale.costs.step import profile_tensors

    cluster = ClusterSpec.from_catalog("P100", 4, "pcie3", "25gbe")
    for name, ips, batch, published in (("inception_v3", 142, 64, 0.90), ("resnet101", 140, 64, 0.90),
                                        ("vgg16", 154, 64, 0.68)):
        m = known_model(name)
        tb, costs = profile_tensors(m["params"] * 4.0, m["tail_params"], m["tail_compute"])
        job = Job(name, m["params"], batch, batch / ips, batch / ips, tensor_bytes=tb, tensor_costs=costs)
        p = forecast(job, cluster, StrategySpec(bucket_mb=64), [512])[0]
        assert abs(p.efficiency - published) <= 0.10, (name, p.efficiency)


def test_fsdp_forecast_sends_one_and_a_half_all_reduces_and_hides_them_behind_compute():
    # 8 equal units of 100 MB of fp32 parameters; all-gathers and reduce-scatters on one 10 GB/s-class link.
    cluster = ClusterSpec.from_catalog("H100", 8, "nvlink4", "100gbe")
    job = Job("j", params=200_000_000, batch_size=8, step_s=0.5, compute_s=0.5, tensor_bytes=[1e8] * 8)
    ddp, fsdp = (forecast(job, cluster, StrategySpec(fsdp_units=u), [1, 16]) for u in (0, 8))
    assert fsdp[0].step_time_s == pytest.approx(ddp[0].step_time_s)  # one device: nothing to gather
    # Two gathers and one reduce-scatter per unit (fp32): 1.5 all-reduces of the whole model.
    allreduce = cluster.allreduce_s(8e8, 16)
    assert fsdp[1].comm_total_s == pytest.approx(1.5 * allreduce, rel=0.05)
    assert 0 < fsdp[1].comm_exposed_s < fsdp[1].comm_total_s  # prefetch hides most of it behind the units' compute
    assert fsdp[1].strategy == "FSDP, 8 units"


def test_fsdp_is_forecast_on_its_own():
    from trainscale.sim.cli import main

    with pytest.raises(ConfigError) as e:  # the command line prints it as one line and exits 2
        main(["--params", "25M", "--samples-per-s-1", "100", "--batch-size", "8", "--gpu", "H100",
              "--fsdp-units", "4", "--zero1"])
    assert str(e.value) == "--fsdp-units = 4: FSDP is forecast on its own, not with --zero1"


def _across_nodes(**measured) -> Calibration:
    """What `plan calibrate --nproc 2 --nnodes 2` measures: the node's own all-reduce at 2 processes, the
    all-reduce over both nodes' 4 processes (flat) and the link alone (1 process per node); ``measured``: more."""
    across = {"1": {"alpha": 5e-4, "beta": 1.3e-9, "cpu_alpha": 4e-4, "cpu_beta": 8e-10},
              "2": {"alpha": 6e-3, "beta": 1.9e-9, "cpu_alpha": 1.7e-3, "cpu_beta": 8e-10}}
    return Calibration({"model.name": "mlp", "data.batch_size": 32}, [], 10, [40.0], 0.0, 1.0, 2,
                       {"1": {"step_s": 0.01, "compute_s": 0.008}},
                       allreduce={"2": {"alpha": 7e-4, "beta": 6e-10, "cpu_alpha": 2e-4, "cpu_beta": 7e-10}},
                       share={"2": 0.4}, nnodes=2, across=across, **measured)


def test_a_calibration_across_nodes_forecasts_flat_and_hierarchical_from_its_measured_parts(tmp_path):
    # A file written before the hierarchical all-reduce was measured itself: no across_hier, no replay_hier.
    doc = dataclasses.asdict(_across_nodes())
    del doc["across_hier"], doc["replay_hier"]
    (tmp_path / "cal.json").write_text(json.dumps(doc))
    cal = Calibration.load(tmp_path / "cal.json")
    assert (cal.across_hier, cal.replay_hier) == ({}, {})
    c = cal.cluster(4)
    n = 4e6
    assert c.gpus_per_node == 2  # a node holds what was calibrated on each, whatever --nproc asks
    assert c.allreduce_s(n, 2) == pytest.approx(7e-4 + 6e-10 * n)  # within a node: the node's own fit
    assert c.allreduce_s(n, 4) == pytest.approx(6e-3 + 1.9e-9 * n)  # flat over both nodes: measured as such
    # Hierarchical: the node's all-reduce (reduce-scatter + all-gather) and the inter-node one on the same bytes.
    assert c.allreduce_s(n, 4, hierarchical=True) == pytest.approx(7e-4 + 6e-10 * n + 5e-4 + 1.3e-9 * n)
    assert c.comm_cpu_s(n, 4) == pytest.approx(1.7e-3 + 8e-10 * n)
    assert c.comm_cpu_s(n, 4, hierarchical=True) == pytest.approx(2e-4 + 7e-10 * n + 4e-4 + 8e-10 * n)
    assert c.allreduce_s(n, 8) > c.allreduce_s(n, 4)  # 4 nodes: the ring shape beyond the measured 2
    assert c.job_at(Job("j", 10, 32, 0.01, 0.008), 4)[1] == c.job_at(Job("j", 10, 32, 0.01, 0.008), 2)[1]
    from trainscale.sim.cli import _across_nodes as said

    assert said(cal)["hierarchical_allreduce"].startswith("the node's all-reduce plus the link's, each measured")


def test_a_calibration_across_nodes_forecasts_hierarchical_from_its_own_measurement(tmp_path):
    # The hierarchical all-reduce measured as the hook runs it: 10 ms more than its parts at every size.
    hier = {"2": {"alpha": 7e-4 + 5e-4 + 1e-2, "beta": 6e-10 + 1.3e-9, "cpu_alpha": 3e-3, "cpu_beta": 2e-9}}
    # The skeletons at 2 x 2: flat 30 ms, hierarchical 45 ms (25 MB buckets, overlapped: the plan's default).
    step = {"bucket_mb": 25.0, "overlap": True, "buckets": 1, "threads": 1}
    _across_nodes(across_hier=hier, replay={"4": {**step, "step_s": 0.03}},
                  replay_hier={"4": {**step, "step_s": 0.045}}).save(tmp_path / "cal.json")
    cal = Calibration.load(tmp_path / "cal.json")
    c = cal.cluster(4)
    n = 4e6
    assert c.allreduce_s(n, 4, hierarchical=True) == pytest.approx(1.12e-2 + 1.9e-9 * n)  # the fit, not the parts
    assert c.allreduce_s(n, 4) == pytest.approx(6e-3 + 1.9e-9 * n)  # flat unchanged
    assert c.comm_cpu_s(n, 4, hierarchical=True) == pytest.approx(3e-3 + 2e-9 * n)
    # 4 nodes: only the inter-node part changes, by the link's all-reduce from 2 to 4 nodes (ring shape).
    link = c.allreduce_s(n, 8, hierarchical=True) - c.allreduce_s(n, 4, hierarchical=True)
    parts = ClusterSpec(gpus_per_node=2, fitted=c.fitted, across=c.across, nodes_fitted=2)
    assert link == pytest.approx(parts.allreduce_s(n, 8, hierarchical=True) - parts.allreduce_s(n, 4, hierarchical=True))
    assert link > 0
    # The plan at 2 x 2 is each skeleton as measured, flat and hierarchical.
    job = cal.base_job(1)
    flat, hierarchical = (forecast(job, c, StrategySpec(hierarchical=h), [4])[0] for h in (False, True))
    assert (flat.step_time_s, hierarchical.step_time_s) == (pytest.approx(0.03), pytest.approx(0.045))
    from trainscale.sim.cli import main

    main(["--calibration", str(tmp_path / "cal.json"), "--nproc", "4", "--hierarchical", "--out",
          str(tmp_path / "plan"), "--json", str(tmp_path / "plan.json")])
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["points"][0]["step_time_s"] == pytest.approx(0.045)
    assert plan["assumptions"]["hierarchical_allreduce"].startswith("measured across 2 nodes as strategy.hierarch")
    assert plan["assumptions"]["skeleton_hierarchical_step_s"] == {"4": 0.045}
