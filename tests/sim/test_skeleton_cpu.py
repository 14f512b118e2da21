"""The job's skeleton on P ranks records its CPU per step: what Gloo used beyond the spin, as the step paces it."""

from __future__ import annotations

import pytest

from trainscale.sim.calibrate import _replayed


def test_the_replay_entry_keeps_what_the_skeleton_used_beyond_its_spin():
    sk = {"cpu_s": 0.002, "rest_cpu_s": 0.0005, "buckets": [1e6]}
    step = {"step_s": 0.01, "rank_step_s": [0.01, 0.01], "steps": 50, "rank_cpu_s": [0.0060, 0.0064]}
    r = _replayed(step, {"bucket_mb": 25.0, "overlap": True}, sk, 2)
    # each of the 2 threads spun 2.5 ms: 5 ms of the ranks' mean 6.2 ms; the exchange used the rest
    assert r["spin_cpu_s"] == pytest.approx(0.0025) and r["exchange_cpu_s"] == pytest.approx(0.0012)
    old = _replayed({"step_s": 0.01, "rank_step_s": [0.01], "steps": 50}, {"bucket_mb": 25.0, "overlap": True}, sk, 1)
    assert old["exchange_cpu_s"] is None
