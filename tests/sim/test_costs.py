"""Cost models against values computed by hand."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainscale.costs.collectives import (
    AlphaBeta,
    bus_bandwidth,
    hierarchical_time,
    nccl_ring_time,
    ps_bytes_at_server,
    ring_bytes_per_worker,
    ring_time,
    tree_time,
)
from trainscale.costs.order_stats import expected_max_normal, predicted_update_time, sigma_from_spread, straggler_wait
from trainscale.costs.step import exposed_comm, make_buckets, pipeline_bubble, ready_at


def test_ring_and_ps_bytes_seed002():
    # 100 MB over 4 workers: ring 2 x 100 x 3/4 = 150 MB per worker; a PS moves 2 x 100 x 3 = 600 MB
    assert ring_bytes_per_worker(100e6, 4) == pytest.approx(150e6)
    # The lecture's 2N(P-1) counts the server among P = 4 processes: 3 learners.
    assert ps_bytes_at_server(100e6, 3) == pytest.approx(2 * 100e6 * (4 - 1))
    assert ring_bytes_per_worker(100e6, 1) == 0


def test_bus_bandwidth_nccl_tests():
    assert bus_bandwidth(10e9, 8) == pytest.approx(17.5e9)  # 10 x 2 x 7/8


def test_ring_time_by_hand():
    # 8 ranks, 80 MB, 10 us per step, 10 GB/s: 14 x 10 us + 140 MB / 10 GB/s = 0.14 ms + 14 ms
    assert ring_time(80e6, 8, 10e-6, 1 / 10e9) == pytest.approx(14e-5 + 14e-3)


def test_tree_time_by_hand():
    # 8 ranks: 2 x log2(8) = 6 hops; 2N bytes
    assert tree_time(1e6, 8, 1e-6, 1e-9) == pytest.approx(6e-6 + 2e-3)


def test_hierarchical_by_hand():
    intra, inter = AlphaBeta(1e-6, 1e-10), AlphaBeta(10e-6, 1e-9)
    n, local, nodes = 64e6, 4, 2
    rs_ag = 2 * (3 * 1e-6 + n * 3 / 4 * 1e-10)          # reduce-scatter + all-gather inside the node
    inter_ring = 2 * 1 * 10e-6 + 2 * (n / 4) * 1 / 2 * 1e-9  # ring of 2 nodes on a quarter of the bytes
    assert hierarchical_time(n, local, nodes, intra, inter) == pytest.approx(rs_ag + inter_ring)


def test_nccl_ring_latency_and_network_bound():
    # 2 nodes x 4: 14 steps, 4 of them on the network; bandwidth = the NIC's
    t = nccl_ring_time(8e6, 4, 2, 12e9, 5.7e-6, 3e9, 14e-6, 8.4e-6)
    lat = 8.4e-6 + 10 * 5.7e-6 + 4 * 14e-6
    assert t == pytest.approx(lat + 2 * 8e6 * 7 / 8 / 3e9)


def test_order_statistics():
    assert [round(expected_max_normal(p), 4) for p in (1, 2, 3, 4)] == [0.0, 0.5642, 0.8463, 1.0294]
    assert sigma_from_spread(0.2563, 1.0) == pytest.approx(0.1)
    assert straggler_wait(2, 0.1) == pytest.approx(0.05642, abs=1e-5)
    # seed 002: sync waits for E[X_{P:P}] = H_P x mean for exponentials; async gives mean / P
    assert predicted_update_time("sync", 4, 4, 1.0) == pytest.approx(1 + 1 / 2 + 1 / 3 + 1 / 4)
    assert predicted_update_time("async", 4, 1, 1.0) == pytest.approx(0.25)
    assert predicted_update_time("k-batch-sync", 4, 2, 1.0) == pytest.approx(0.5)


def test_pipeline_bubble():
    assert pipeline_bubble(4, 8, "gpipe") == pytest.approx(3 / 11)
    assert pipeline_bubble(4, 8, "1f1b") == pytest.approx(3 / 11)
    assert pipeline_bubble(4, 8, "interleaved:2") == pytest.approx(1.5 / 9.5)
    assert pipeline_bubble(1, 8) == 0


def test_buckets_and_overlap():
    mb = 1024 * 1024
    assert make_buckets([mb / 2] * 4, 25 * mb) == [mb, mb]  # the first bucket closes at 1 MB like DDP's
    assert make_buckets([10.0, 20.0], 0) == [10.0, 20.0]
    sizes = [100.0] * 4
    buckets = make_buckets(sizes, 200, first_cap=0)  # two buckets, ready at half and at the end of backward
    ready = ready_at(buckets, sizes, backward_s=1.0)
    assert ready == pytest.approx([0.5, 1.0])
    # each bucket takes 0.3 s: the first hides behind backward, the second is exposed in full
    exposed, total = exposed_comm(buckets, ready, lambda n: 0.3, backward_s=1.0)
    assert (exposed, total) == pytest.approx((0.3, 0.6))
    exposed, _ = exposed_comm(buckets, ready, lambda n: 0.3, backward_s=1.0, overlap=False)
    assert exposed == pytest.approx(0.6)


def test_cost_models_import_without_torch():
    code = ("import sys, trainscale.costs.forecast, trainscale.costs.topology, trainscale.sim.calibration; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_host_processor_sharing():
    from trainscale.costs.host import outside_threads, share_per_thread, shared_step_s, slowdown_at, thread_slowdown

    share = share_per_thread(cpu_s=0.25, wall_s=0.5, threads=1)
    assert share == pytest.approx(0.5) and thread_slowdown(share) == pytest.approx(2.0)
    assert share_per_thread(cpu_s=0.9, wall_s=0.5, threads=2) == pytest.approx(0.9)
    assert outside_threads(0.5, threads=1, cores=2) == pytest.approx(3.0)  # 2 / (1 + 3) = 0.5
    assert outside_threads(0.99, threads=1, cores=2) == 0.0  # not held back: others fit in the spare core
    assert slowdown_at(4, 1, 2, outside=3.0) == pytest.approx(3.5)
    assert slowdown_at(1, 1, 2, outside=0.0) == 1.0
    assert shared_step_s(cpu_s=0.28, threads=1, slowdown=2.0) == pytest.approx(0.56)
    assert shared_step_s(cpu_s=0.28, threads=2, slowdown=1.0) == pytest.approx(0.14)
