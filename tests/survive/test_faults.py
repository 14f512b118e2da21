"""Fault injection on 2-process jobs: a killed rank restarts and resumes, a stopped rank is named, SIGTERM saves.

Every job runs in its own session with a timeout; whatever happens, no process of it is left behind.
"""

import json
import random
import signal
import time

import pytest
from survive_jobs import JOB, finish, run, same_weights, start, wait_for

TIMEOUT_S = 10  # --job.timeout_s of the hang tests
MARGIN_S = 20  # heartbeat, SIGKILL, torchrun noticing, on a loaded 2-core machine


@pytest.mark.full  # resume to the same weights: the SIGTERM test below; restarts: test_max_restarts_restarts_the_workers
@pytest.mark.dist
@pytest.mark.timeout(300)
def test_kill9_with_one_restart_resumes_bit_for_bit(tmp_path, reference):
    step = random.Random().randint(11, 38)  # after the first checkpoint (step 10)
    r = run(["train", "--nproc", "2", "--max-restarts", "1", *JOB, "--checkpoint.dir", str(tmp_path),
             "--json", str(tmp_path / "s.json")], timeout=240, fault=f"kill@{step}:1")
    assert r.rc == 0, r.text
    assert not r.left
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["restarts"] == 1 and s["steps"] == 40, (step, s["restarts"])
    assert s["resumed_from_step"] == step // 10 * 10
    assert same_weights(reference, tmp_path / "last.pt"), f"killed at step {step}"


@pytest.mark.full  # a stopped rank named by the hang report, with its collective: test_fault_localisation's `stop`
@pytest.mark.dist
@pytest.mark.timeout(200)
@pytest.mark.parametrize("fault,culprit", [("stop@13:1", 1), ("stop@20:0:checkpoint", 0)],
                         ids=["in-step", "in-checkpoint-write"])
def test_a_stopped_rank_ends_the_job_with_its_name(tmp_path, fault, culprit):
    p = start(["train", "--nproc", "2", *JOB, "--job.timeout_s", str(TIMEOUT_S), "--checkpoint.dir", str(tmp_path)],
              fault=fault)
    t_first = wait_for(tmp_path / "latest", p, 150)  # the stop comes soon after the first checkpoint
    r = finish(p, 150)
    gone_after = time.monotonic() - t_first
    assert r.rc not in (0, None), r.text
    assert not r.left, f"processes left: {r.left}"
    assert gone_after < TIMEOUT_S + MARGIN_S, f"{gone_after:.0f} s after the first checkpoint\n{r.text}"
    assert f"rank {culprit} (pid" in r.text and "stopped making progress" in r.text, r.text
    last = r.text.strip().splitlines()[-1]
    assert last.startswith("trainscale train: rank") and f"rank {culprit} (pid" in last, last
    # The rank that waited names the collective it entered last (the Flight Recorder's) and where its code is.
    assert f"rank {1 - culprit} waited in" in last and "last collective #" in last and ", at " in last, last
    if "checkpoint" in fault:  # the write never completed: the pointer still names the previous checkpoint
        assert (tmp_path / "latest").read_text().strip() == "step_10.pt"
        assert not (tmp_path / "step_20.pt").exists()


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_sigterm_to_the_launcher_checkpoints_and_resume_auto_finishes_the_same(tmp_path, reference):
    args = ["train", "--nproc", "2", *JOB, "--checkpoint.dir", str(tmp_path)]
    p = start(args)
    wait_for(tmp_path / "latest", p, 150)
    p.send_signal(signal.SIGTERM)
    r = finish(p, 120)
    assert r.rc == 75, r.text  # EXIT_PREEMPTED
    assert not r.left
    assert "preempted" in r.text and "--resume auto" in r.text
    name = (tmp_path / "latest").read_text().strip()
    r = run([*args, "--resume", "auto"], timeout=150)
    assert r.rc == 0, r.text
    if name != "last.pt":  # SIGTERM came before the run ended on its own
        assert f"resumed from {tmp_path / name}" in r.text
    assert same_weights(reference, tmp_path / "last.pt")
