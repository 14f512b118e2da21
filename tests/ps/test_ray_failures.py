"""Failures on a real local Ray: a learner or a server shard killed mid-run; the run finishes, never hangs."""

from __future__ import annotations

import os
import signal

import pytest

from trainscale.ps.job import run_ps


def kill(ray, actor) -> int:
    """SIGKILL the actor's process (as a crashed machine would); Ray restarts it."""
    pid = ray.get(actor.pid.remote(), timeout=60)
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.full  # a learner killed, restarted and training again: the downpour test below
@pytest.mark.timeout(200)
def test_killed_learner_is_restarted_and_rejoins_while_async_training_goes_on(ray_local, ps_actors, ps_config):
    cfg = ps_config("--ps.mode", "async", "--ps.learners", "4", "--ps.shards", "2", "--ps.steps", "100000",
                    "--ps.delay", "exp:0.02", "--ps.timeout_s", "90")
    seen = {"killed_at": None, "without": 0, "back_at": None}

    def on_update(update, driver):
        line = driver.rec.timeline[-1]
        if update == 10:
            kill(ray_local, ps_actors.learners[1])
            seen["killed_at"] = update
        elif seen["killed_at"] and 1 in driver.lost_at:
            seen["without"] += 1  # an update while learner 1 is away
        if seen["killed_at"] and update > seen["killed_at"] + 5 and 1 in line["learners"] and driver.rec.learner_restarts:
            seen["back_at"] = update  # learner 1 pushed again after its restart
            driver.request_stop()
        if driver.rec.now() > 100:
            driver.request_stop()

    s = run_ps(cfg, actors=ps_actors, on_update=on_update)
    # One process killed once is one restart, however many of its tasks failed with it.
    assert s["restarts"] == 1 and s["learner_restarts"] == 1 and s["errors"] == 0, s
    assert seen["back_at"] is not None, "the killed learner never came back"
    assert seen["without"] > 10  # the other learners kept training while it restarted
    assert s["eval_accuracy"] > 0.5


@pytest.mark.full  # a shard killed and restored: the downpour test below (its lost updates: make test-full)
@pytest.mark.timeout(120)
def test_killed_shard_restores_its_snapshot_and_counts_lost_updates(ray_local, ps_actors, ps_config):
    cfg = ps_config("--ps.mode", "k-async", "--ps.k", "2", "--ps.learners", "4", "--ps.shards", "2",
                    "--ps.steps", "80", "--ps.snapshot_every", "10")

    def on_update(update, driver):
        if update == 25:
            kill(ray_local, ps_actors.shards[0])

    s = run_ps(cfg, actors=ps_actors, on_update=on_update)
    assert s["updates"] == 80 and s["shard_restarts"] == 1 and s["restarts"] >= 1
    # Snapshot at 20, killed after 25: the updates since the snapshot (5 or 6) are lost on that shard.
    assert 5 <= s["updates_lost"] <= 7, s["updates_lost"]
    assert s["eval_accuracy"] > 0.5


@pytest.mark.timeout(200)
def test_downpour_survives_a_killed_learner_and_a_killed_shard(ray_local, ps_actors, ps_config):
    cfg = ps_config("--ps.mode", "downpour", "--ps.learners", "3", "--ps.shards", "2", "--ps.steps", "100000",
                    "--ps.lr", "0.01", "--ps.delay", "exp:0.01", "--ps.snapshot_every", "20", "--ps.timeout_s", "90")
    state = {"learner": None, "shard": None}

    def on_update(update, driver):
        if state["learner"] is None and update >= 20:
            kill(ray_local, ps_actors.learners[2])
            state["learner"] = update
        if state["shard"] is None and update >= 50:
            kill(ray_local, ps_actors.shards[1])
            state["shard"] = update
        back = driver.rec.learner_restarts and 2 in driver.runs.values() and not driver.setups
        if state["shard"] and driver.rec.shard_restarts and back and update > state["shard"] + 20:
            driver.request_stop()
        if driver.rec.now() > 100:
            driver.request_stop()

    s = run_ps(cfg, actors=ps_actors, on_update=on_update)
    assert s["learner_restarts"] >= 1 and s["shard_restarts"] == 1
    assert s["updates"] > state["shard"] + 20
    # The loss counted is a lower bound: the shard's last polled version less its snapshot. When that poll fell on a
    # snapshot version it is 0 (seen beside a CPU hog, 2026-11-28); it never exceeds one snapshot interval.
    assert 0 <= s["updates_lost"] <= 20, s["updates_lost"]
