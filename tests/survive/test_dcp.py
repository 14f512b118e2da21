"""Sharded checkpoints (torch.distributed.checkpoint): ZeRO's state written per rank, resumed at another world size."""

import json

import pytest
from survive_jobs import run

ZERO = ["--model", "mlp", "--model.width", "32", "--data", "digits", "--steps", "30", "--log.progress", "lines",
        "--log.every", "5", "--log.skip_first", "1", "--checkpoint.format", "dcp", "--strategy.shard_optimizer", "true"]


@pytest.mark.dist
@pytest.mark.timeout(500)
def test_zero_checkpoint_of_2_processes_resumes_on_1_and_on_4_with_the_same_loss(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    # Asynchronous writes on the way: the folder must be complete when `latest` names it.
    r = run(["train", "--nproc", "2", *ZERO, "--batch-size", "16", "--checkpoint.every", "15", "--checkpoint.keep",
             "5", "--checkpoint.async_save", "true", "--checkpoint.dir", str(a), "--json", str(a / "s.json")], 200)
    assert r.rc == 0, r.text
    assert (a / "step_15" / ".metadata").is_file() and len(list((a / "step_15").glob("*.distcp"))) == 2
    # The same global batch on 1 process: 32 samples per step.
    r = run(["train", *ZERO, "--batch-size", "32", "--checkpoint.dir", str(b), "--resume", str(a / "step_15"),
             "--json", str(b / "s.json")], 150)
    assert r.rc == 0, r.text
    assert "resumed from" in r.text and "at step 15" in r.text
    # And on 4 processes of 8 samples: DCP reshards the 2 optimizer shards into 4.
    c = tmp_path / "c"
    r = run(["train", "--nproc", "4", *ZERO, "--batch-size", "8", "--checkpoint.dir", str(c), "--resume",
             str(a / "step_15"), "--json", str(c / "s.json")], 200)
    assert r.rc == 0, r.text
    full, on1, on4 = (json.loads((d / "s.json").read_text()) for d in (a, b, c))
    assert on4["world_size"] == 4
    for resumed in (on1, on4):
        assert resumed["loss_last"] == pytest.approx(full["loss_last"], rel=1e-4)
        assert resumed["eval_loss"] == pytest.approx(full["eval_loss"], rel=1e-4)
