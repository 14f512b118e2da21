"""The clean plain DDP script: bench runs it (its timeline too), and the doctor claims no fault of the script
while its scaling figures match a separate bench within noise."""

from __future__ import annotations

import pytest
from inject_helpers import OFFLINE, SCRIPTS, false_claims

from clitools import read_json, run_cli

pytestmark = pytest.mark.dist

COMMAND = ["--", "torchrun", "--nproc-per-node", "2", str(SCRIPTS / "ddp_train.py"), "--steps", "100000"]


def _bench(out, nproc: str, repeat: int, steps: int):
    r = run_cli(["bench", "--nproc", nproc, "--repeat", str(repeat), "--job.threads", "1", "--job.steps", str(steps),
                 "--out", str(out), *COMMAND], timeout=400, env=OFFLINE)
    assert r.rc == 0, r.err[-3000:]
    return read_json(out / "bench.json")


@pytest.mark.timeout(200)
def test_bench_runs_the_script_with_its_timeline(tmp_path):
    bench = _bench(tmp_path / "b", "1", 1, 12)
    assert bench["points"][0]["measured_steps"] > 0
    assert (tmp_path / "b" / "runs" / "n1_r0" / "timeline.json").is_file()


@pytest.mark.full
@pytest.mark.timeout(900)
def test_clean_script_doctor_claims_no_fault_and_matches_bench(tmp_path):
    r = run_cli(["doctor", "--nproc", "2", "--repeat", "2", "--quick", "--cycles", "4", "--phase-steps", "6",
                 "--out", str(tmp_path / "doc"), *COMMAND], timeout=560, env=OFFLINE)
    assert r.rc == 0, r.err[-3000:]
    doc = read_json(tmp_path / "doc" / "doctor.json")
    assert false_claims(doc) == []  # what a clean run may report (inject_helpers.false_claims)
    noise = doc["scaling_loss_noise_s"]
    # The rule: the two efficiencies differ by at most the sum of their noises (bench's across its repeats; the
    # doctor's scaling-loss noise carried into efficiency, t1/tN, as eff * noise / tN).
    bench = _bench(tmp_path / "bench", "1,2", 3, 80)["verdict"]
    doctor_noise = doc["efficiency"] * noise / doc["step_time_n_s"]
    assert abs(doc["efficiency"] - bench["efficiency"]) <= bench["noise"] + doctor_noise
