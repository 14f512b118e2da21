"""Pipelines and hybrid DP x PP train exactly like one process on the same global batch.

Tolerance: 1e-5 (absolute and relative) on every weight after 6 SGD-momentum steps, 1e-5 relative on
the losses; micro-batching only changes the float32 summation order of the gradients.
"""

import json
from pathlib import Path

import pytest
import torch
from pipeline_common import COMMON, DEPTH, GLOBAL_BATCH, STEPS, WIDTH, assert_same_training, reference

from clitools import REPO, run_cli


@pytest.fixture(scope="module")
def ref6():
    return reference()


def _weights(folder: Path) -> dict:
    if (folder / "last").is_dir():  # a sharded checkpoint, read back in this process
        from trainscale.models import build_model
        from trainscale.train.checkpoint.dcp import dcp_load
        model = build_model("mlp", (1, 8, 8), 10, width=WIDTH, depth=DEPTH)
        dcp_load(folder / "last", model, None, 0)
        return model.state_dict()
    return torch.load(folder / "last.pt", weights_only=True)["model"]


# A pipeline's parity with one process, and its resume: the two-stage test below; 4 processes: make test-full.
@pytest.mark.full
@pytest.mark.dist
@pytest.mark.timeout(150)
def test_four_stages_and_two_by_two_hybrid_equal_one_process(tmp_path, ref6):
    cases = {"gpipe4": ["--strategy.pipeline_stages", "4", "--strategy.schedule", "gpipe"],
             "1f1b4": ["--strategy.pipeline_stages", "4", "--strategy.schedule", "1f1b", "--strategy.split", "uniform"],
             # sharded checkpoint (torch.distributed.checkpoint): still one whole-model state dict
             "hybrid2x2": ["--strategy.pipeline_stages", "2", "--strategy.schedule", "1f1b", "--checkpoint.format", "dcp"]}
    jobs = []
    for name, args in cases.items():  # the same global batch: each replica reads GLOBAL_BATCH / replicas
        batch = GLOBAL_BATCH * int(args[1]) // 4
        jobs.append(name + "=" + ",".join([*COMMON, "--job.steps", str(STEPS), "--data.batch_size", str(batch),
                                           "--checkpoint.dir", str(tmp_path / name), *args]))
    r = run_cli(["launch", "--nproc-per-node", "4", str(REPO / "benchmarks" / "_pipeline_job.py"), str(tmp_path),
                 *jobs], timeout=140)
    assert r.rc == 0, r.text[-3000:]
    for name in cases:
        summary = json.loads((tmp_path / name / "run.json").read_text())
        assert_same_training(_weights(tmp_path / name), summary, ref6, name)
    hybrid = json.loads((tmp_path / "hybrid2x2" / "run.json").read_text())["pipeline"]
    assert (hybrid["stages"], hybrid["replicas"], len(hybrid["stage_time_s"])) == (2, 2, 2)
    assert "stage" in r.err and "replica" in r.err  # the environment table shows the layout


@pytest.mark.dist
@pytest.mark.timeout(150)
def test_two_stage_gpipe_equals_one_process_and_resumes_as_plain_ddp(tmp_path, ref6):
    out = tmp_path / "run.json"
    r = run_cli(["train", "--nproc", "2", *COMMON, "--job.steps", str(STEPS), "--data.batch_size", str(GLOBAL_BATCH),
                 "--strategy.pipeline_stages", "2", "--strategy.schedule", "gpipe", "--strategy.microbatches", "4",
                 "--checkpoint.dir", str(tmp_path), "--json", str(out)], timeout=120)
    assert r.rc == 0, r.text[-3000:]
    summary = json.loads(out.read_text())
    assert_same_training(_weights(tmp_path), summary, ref6, "2-stage gpipe")
    pipe = summary["pipeline"]
    assert pipe["microbatches"] == 4 and pipe["schedule"] == "gpipe" and len(pipe["boundaries"]) == 2
    assert pipe["bubble_theory"] == pytest.approx(1 / 5)  # (S - 1) / (M + S - 1)
    assert len(pipe["layer_profile"]) == 4 and pipe["imbalance"] >= 1.0
    # The whole-model checkpoint (weights and every stage's momentum) goes on as one plain process.
    r = run_cli(["train", *COMMON, "--job.steps", "9", "--data.batch_size", str(GLOBAL_BATCH), "--resume",
                 str(tmp_path / "last.pt"), "--checkpoint.dir", str(tmp_path / "plain"), "--json", str(out)],
                timeout=120)
    assert r.rc == 0, r.text[-3000:]
    want = reference(steps=9)
    for k, v in want[0].items():
        torch.testing.assert_close(_weights(tmp_path / "plain")[k], v, atol=1e-5, rtol=1e-5)
