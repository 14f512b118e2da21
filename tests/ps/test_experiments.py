"""The experiments' machinery on a small scale (the full runs are in the report, not in the test suite)."""

from __future__ import annotations

import pytest

from trainscale.ps.experiments import convergence_experiment, runtime_experiment


@pytest.mark.timeout(120)
def test_runtime_experiment_measures_sync_slower_than_async_and_writes_a_report(ray_local, ps_actors, tmp_path):
    r = runtime_experiment(tmp_path, [], [4], ("sync", "async"), mean=0.05, seconds=1.5, min_updates=20,
                           max_updates=60, actors=ps_actors)
    by = {row["mode"]: row for row in r["rows"]}
    # P H_P = 8.3 predicted; a loose bound, since a short run on a busy machine is noisy.
    assert by["sync"]["measured_s"] > 3 * by["async"]["measured_s"]
    assert 0.5 < by["sync"]["measured_s"] / by["sync"]["predicted_s"] < 2.0
    assert (tmp_path / "runtime.md").is_file() and (tmp_path / "runtime.png").stat().st_size > 1000
    assert "P·H_P" in (tmp_path / "runtime.md").read_text()


@pytest.mark.timeout(120)
def test_convergence_experiment_draws_curves(ray_local, ps_actors, tmp_path, monkeypatch):
    import trainscale.ps.experiments as ex

    monkeypatch.setattr(ex, "CONVERGENCE_RUNS", (("sync", "constant"), ("async", "staleness")))
    r = convergence_experiment(tmp_path, ["--model.width", "32"], learners=2, mean=0.005, seconds=1.5,
                               actors=ps_actors)
    assert [run["label"] for run in r["runs"]] == ["sync", "async (staleness)"]
    assert all(len(run["curve"]) >= 2 for run in r["runs"])
    assert (tmp_path / "convergence_time.png").is_file() and (tmp_path / "convergence_updates.png").is_file()
