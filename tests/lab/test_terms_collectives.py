"""A framework's own collectives outside DDP in the doctor's terms: communication, not compute, and the sum holds."""

from __future__ import annotations

import pytest

from trainscale.lab.analysis import analyse
from trainscale.lab.stats import framework_collectives_s

CTX = {"bucket_mb": 25.0, "overlap": True, "workers": 0, "batch_size": 32, "slow_rank": -1, "sample_delay_ms": 0,
       "strategy_fields": [], "data_fields": []}
TIMES = {("base", 1): 0.010, ("no_data", 1): 0.009, ("no_comm", 1): 0.0088,
         ("base", 2): 0.024, ("no_data", 2): 0.022, ("no_comm", 2): 0.016}
ADDITIVE = ("input", "communication", "sync_wait", "straggler", "compute_interference")


def _summary(t: float, ranks: int, own: list[float] | None) -> dict:
    s = {"step_time_s": t, "rank_step_time_s": [t] * ranks, "rank_compute_s": [t / 2] * ranks,
         "measured_steps": 100, "step_time_spread": 0.01, "samples_per_s": 32 * ranks / t, "data_wait_frac": 0.1,
         "allreduce_calls_per_step": 1, "bucket_mb": 25.0, "overlap": True, "threads": 1}
    if own is not None:  # each rank blocked ``own[r]`` s a step in one all_gather, over 3 cycles of 4 steps
        s["rank_framework_collective_steps"] = [[[c, x] for c in range(3) for _ in range(4)] for x in own]
        s["framework_collective_calls_per_step"] = 1.0 if ranks > 1 else 0.0
        s["framework_collectives"] = {"calls_per_step": {"all_gather": 1.0} if ranks > 1 else {}}
    return s


def _runs(own_n: list[float] | None) -> dict:
    """Two repeats; ``own_n``: each rank's seconds in the framework's collectives at 2 processes (None: not timed,
    as on the run API)."""
    return {(c, k): [_summary(t + j, k, (own_n if k == 2 else [0.0]) if own_n is not None else None)
                     for j in (0.0, 0.0002)] for (c, k), t in TIMES.items()}


def _causes(own_n: list[float] | None) -> tuple[dict, dict]:
    res = analyse(_runs(own_n), 2, CTX)
    return res, {c["name"]: c for c in res["causes"]}


def test_the_framework_collectives_are_communication_and_the_sum_holds():
    _, plain = _causes(None)
    res, c = _causes([0.003, 0.003])
    moved = c["communication"]["seconds_per_step"] - plain["communication"]["seconds_per_step"]
    assert moved == pytest.approx(0.003, abs=1e-9)
    assert plain["compute_interference"]["seconds_per_step"] - c["compute_interference"]["seconds_per_step"] \
        == pytest.approx(0.003, abs=1e-9)
    assert sum(c[k]["seconds_per_step"] for k in ADDITIVE) == pytest.approx(res["scaling_loss_s"], abs=1e-9)
    assert res["invariants"] == []
    own = c["communication"]["framework_collectives"]
    assert own["by_function"] == {"all_gather": 1.0} and own["s_per_step"] == pytest.approx(0.003)
    assert "framework's own collectives outside DDP" in c["communication"]["evidence"]
    assert "counted under communication" in c["compute_interference"]["evidence"]


def test_the_rank_that_waits_least_counts_not_the_straggler_s_wait():
    """Rank 0 waits 5 ms a step for a slower rank 1 in the framework's gather; rank 1 waits 1 ms: the gather adds
    1 ms to the job's step, the other 4 ms are rank 1's longer compute (the straggler's)."""
    _, plain = _causes(None)
    _, c = _causes([0.005, 0.001])
    moved = c["communication"]["seconds_per_step"] - plain["communication"]["seconds_per_step"]
    assert moved == pytest.approx(0.001, abs=1e-9)


def test_a_run_api_job_records_no_framework_collectives_and_its_causes_are_unchanged():
    _, plain = _causes(None)
    _, zero = _causes([0.0, 0.0])
    for name in ADDITIVE:
        assert zero[name]["seconds_per_step"] == pytest.approx(plain[name]["seconds_per_step"], abs=1e-12)
    assert "framework_collectives" not in plain["communication"]
    assert "framework's own" not in plain["communication"]["evidence"]
    assert framework_collectives_s({"rank_framework_collective_steps": [[[0, float("nan")]]]}) == 0.0


def test_the_per_rank_figure_is_a_median_over_cycles_of_cycle_means():
    rows = [[0, 0.001], [0, 0.003], [1, 0.002], [1, 0.002], [2, 0.050], [2, 0.050]]  # a hiccup block
    assert framework_collectives_s({"rank_framework_collective_steps": [rows]}) == pytest.approx(0.002)
    # A bootstrap replicate counts each cycle as often as it was drawn.
    assert framework_collectives_s({"rank_framework_collective_steps": [rows]}, {0: 2, 2: 1}) == pytest.approx(0.002)
    assert framework_collectives_s({"rank_framework_collective_steps": [rows]}, {2: 2, 1: 1}) == pytest.approx(0.050)
