"""The experiments' machinery on a small scale (the full runs are in the report, not in the test suite)."""

from __future__ import annotations

import json
import math

import pytest

from trainscale.ps.experiments import convergence_experiment, runtime_experiment
from trainscale.reporting import mean_interval


def test_mean_interval_is_the_student_t_interval():
    iv = mean_interval([1.0, 2.0, 3.0, float("nan")])  # nan (a failed measure) is left out
    assert iv.n == 3 and iv.mean == 2.0 and iv.se == pytest.approx(1 / math.sqrt(3))
    assert (iv.lo, iv.hi) == pytest.approx((2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)))
    assert iv.contains(4.0) and not iv.contains(4.6)
    one = mean_interval([5.0])
    assert one.n == 1 and math.isnan(one.se) and one.fmt() == "5.0" and one.to_json()["se"] is None


@pytest.mark.full
@pytest.mark.timeout(120)
def test_runtime_experiment_writes_every_seed_and_intervals(ray_local, ps_actors, tmp_path):
    r = runtime_experiment(tmp_path, [], [2], ("sync", "async"), mean=0.03, seconds=0.5, min_updates=12,
                           max_updates=40, actors=ps_actors, seeds=(0, 1, 2))
    doc = json.loads((tmp_path / "runtime.json").read_text())
    assert sorted((run["mode"], run["seed"]) for run in doc["runs"]) == [
        ("async", 0), ("async", 1), ("async", 2), ("sync", 0), ("sync", 1), ("sync", 2)]
    cells = {c["mode"]: c for c in doc["cells"]}
    for c in cells.values():
        m = c["measured_s"]
        assert m["n"] == 3 and m["se"] > 0 and m["lo"] < m["mean"] < m["hi"]
        assert m["mean"] == pytest.approx(sum(run["measured_s"] for run in doc["runs"] if run["mode"] == c["mode"]) / 3)
    # P·H_P = 3 at P = 2; a loose bound, since a short run on a busy machine is noisy.
    assert cells["sync"]["measured_s"]["mean"] > 1.5 * cells["async"]["measured_s"]["mean"]
    (ratio,) = doc["sync_async"]
    assert len(ratio["ratios"]) == 3 and ratio["ratio"]["n"] == 3 and ratio["predicted"] == pytest.approx(3.0)
    md = (tmp_path / "runtime.md").read_text()
    assert "P·H_P" in md and "95% interval" in md and md == r["markdown"]
    assert "data:image/png;base64," in (tmp_path / "runtime.html").read_text()
    assert (tmp_path / "runtime.png").stat().st_size > 1000


@pytest.mark.full  # the intervals: test_mean_interval_is_the_student_t_interval; the modes: tests/ps/test_ray_training.py
@pytest.mark.timeout(120)
def test_convergence_experiment_writes_every_seeds_curve_and_intervals(ray_local, ps_actors, tmp_path, monkeypatch):
    import trainscale.ps.experiments as ex

    monkeypatch.setattr(ex, "CONVERGENCE_RUNS", (("async", "constant"), ("async", "staleness")))
    convergence_experiment(tmp_path, ["--model.width", "32"], learners=2, mean=0.005, seconds=1.0, actors=ps_actors,
                           seeds=(0, 1))
    doc = json.loads((tmp_path / "convergence.json").read_text())
    assert sorted((run["label"], run["seed"]) for run in doc["runs"]) == [
        ("async", 0), ("async", 1), ("async (staleness)", 0), ("async (staleness)", 1)]
    assert all(len(run["curve"]) >= 2 for run in doc["runs"])
    for c in doc["cells"]:
        assert c["floor"]["n"] == 2 and c["floor"]["lo"] <= c["floor"]["mean"] <= c["floor"]["hi"]
        assert set(c["time_to"]) == {"0.2", "0.1"}
    (effect,) = doc["staleness_rule"]
    assert effect["mode"] == "async" and len(effect["diffs"]) == 2
    for png in ("convergence_time.png", "convergence_updates.png"):
        assert (tmp_path / png).stat().st_size > 1000
    assert "Does the staleness rule help?" in (tmp_path / "convergence.html").read_text()
