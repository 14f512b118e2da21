"""Scripts that launch themselves: Lightning's hard-coded ``devices`` is run at the baseline anyway, and a script
that spawns its own processes (``mp.spawn``) stops with the reason in one line."""

from __future__ import annotations

import pytest
from inject_helpers import OFFLINE, SCRIPTS, injected

from clitools import run_cli
from trainscale.jobs import RunFailed

pytestmark = pytest.mark.dist


@pytest.mark.timeout(120)
def test_a_script_that_spawns_its_processes_says_why(tmp_path):
    with pytest.raises(RunFailed) as e:
        injected("spawn_train.py", [], tmp_path, nproc=1)
    assert "starts its own processes (torch.multiprocessing.spawn, nprocs=2)" in e.value.detail
    assert "RANK" in e.value.detail


@pytest.mark.timeout(200)
def test_doctor_on_a_spawning_script_is_one_line(tmp_path):
    r = run_cli(["doctor", "--nproc", "2", "--quick", "--out", str(tmp_path / "doc"), "--", "python",
                 str(SCRIPTS / "spawn_train.py")], timeout=180, env=OFFLINE)
    assert r.rc != 0
    assert "starts its own processes" in r.err and "Traceback" not in r.err


@pytest.mark.timeout(200)
def test_lightning_devices_hard_coded_runs_at_the_baseline(tmp_path):
    s = injected("lightning_train.py", ["--steps", "12", "--devices", "2"], tmp_path, nproc=1)
    assert s["world_size"] == 1 and s["measured_steps"] > 0
    assert "devices=2" in s["injected"]["measurements"]["devices"]


@pytest.mark.full
@pytest.mark.timeout(300)
def test_lightning_devices_hard_coded_at_n_as_torchrun_runs_it(tmp_path):
    s = injected("lightning_train.py", ["--steps", "12", "--devices", "2"], tmp_path, nproc=2)
    assert s["world_size"] == 2 and "devices" not in s["injected"]["measurements"]
