"""bench and doctor on a user's own script (``-- python script.py``): the lab launches it, switches the
experiments on through the run API, and reads the summaries it writes."""

from __future__ import annotations

import pytest

from clitools import REPO, read_json, run_cli

EXAMPLE = REPO / "examples" / "classify_digits.py"
pytestmark = [pytest.mark.dist, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_doctor_names_the_slow_input_of_a_users_script(tmp_path):
    out = tmp_path / "doc"
    r = run_cli(["doctor", "--nproc", "2", "--repeat", "2", "--budget", "1", "--cycles", "4", "--quick",
                 "--out", str(out), "--job.threads", "1", "--", "python", str(EXAMPLE), "--slow-input-ms", "3",
                 "--batch-size", "16"], timeout=840)
    assert r.rc == 0, r.text
    doc = read_json(out / "doctor.json")
    top = doc["causes"][0]
    assert top["name"] == "input" and top["significant"] and top["share"] > 0.5, doc["causes"]
    assert "TRAINSCALE_ARGS=" in doc["runs"][0]["command"] and str(EXAMPLE) in doc["runs"][0]["command"]


@pytest.mark.full  # the lab on a user's script: the doctor test above; bench's sweep: tests/lab/test_bench.py
@pytest.mark.timeout(600)
def test_bench_on_a_users_script_reports_its_own_efficiency(tmp_path):
    out = tmp_path / "bench"
    r = run_cli(["bench", "--nproc", "1,2", "--repeat", "1", "--out", str(out), "--steps", "30",
                 "--", str(EXAMPLE)], timeout=540)
    assert r.rc == 0, r.text
    doc = read_json(out / "bench.json")
    one, two = (next(p for p in doc["points"] if p["world_size"] == n) for n in (1, 2))
    assert two["efficiency"] == pytest.approx(two["samples_per_s"] / (2 * one["samples_per_s"]), rel=1e-9)
    assert (out / "report.md").is_file() and doc["runs"][0]["global_batch"] == 32


CRASH = '''
import torch, trainscale
run = trainscale.init()
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt, loader = run.prepare(model, opt, torch.utils.data.TensorDataset(torch.randn(256, 4)))
for (x,) in run.batches(loader, steps=50):
    if run.step_count == 3:
        raise RuntimeError("user bug at step 3")
    run.backward(model(x).pow(2).mean())
    run.step()
run.finish()
'''

NO_API = '''
import torch
print("training without trainscale.init()")
'''


@pytest.mark.timeout(300)
def test_bad_scripts_are_clear_errors(tmp_path):
    missing = run_cli(["doctor", "--", "python", str(tmp_path / "nope.py")])
    assert missing.rc == 2 and "script = " in missing.err and "no such file" in missing.err
    (tmp_path / "crash.py").write_text(CRASH)
    out = tmp_path / "doc"
    crash = run_cli(["doctor", "--repeat", "2", "--out", str(out), "--", str(tmp_path / "crash.py")], timeout=240)
    assert crash.rc == 1 and "user bug at step 3" in crash.err
    doc = read_json(out / "doctor.json")  # partial results kept, with the failing command
    assert doc["error"] and "crash.py" in doc["error"]["command"]
    log = next((out / "runs").glob("*.log")).read_text()
    assert "Traceback" in log and "user bug at step 3" in log
    (tmp_path / "no_api.py").write_text(NO_API)
    plain = run_cli(["bench", "--nproc", "1", "--repeat", "1", "--out", str(tmp_path / "b"), "--",
                     str(tmp_path / "no_api.py")], timeout=120)
    assert plain.rc == 1 and "add `run = trainscale.init()`" in " ".join(plain.err.split())  # rich may wrap it
