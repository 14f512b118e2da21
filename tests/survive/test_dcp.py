"""Sharded checkpoints (torch.distributed.checkpoint): ZeRO's state written per rank, resumed at another world size."""

import json

import pytest
from survive_jobs import run

ZERO = ["--model", "mlp", "--model.width", "32", "--data", "digits", "--steps", "30", "--log.progress", "lines",
        "--log.every", "5", "--log.skip_first", "1", "--checkpoint.format", "dcp", "--strategy.shard_optimizer", "true"]


def _two_process_checkpoint(tmp_path):
    """A ZeRO job on 2 processes that writes a sharded checkpoint at step 15 asynchronously; its summary."""
    a = tmp_path / "a"
    # Asynchronous writes on the way: the folder must be complete when `latest` names it.
    r = run(["train", "--nproc", "2", *ZERO, "--batch-size", "16", "--checkpoint.every", "15", "--checkpoint.keep",
             "5", "--checkpoint.async_save", "true", "--checkpoint.dir", str(a), "--json", str(a / "s.json")], 200)
    assert r.rc == 0, r.text
    assert (a / "step_15" / ".metadata").is_file() and len(list((a / "step_15").glob("*.distcp"))) == 2
    return a


def _resumed_alike(tmp_path, a, nproc, batch):
    """Resume ``a``'s step 15 on ``nproc`` processes at the same global batch: the loss of the uninterrupted run."""
    c = tmp_path / f"on{nproc}"
    r = run(["train", "--nproc", str(nproc), *ZERO, "--batch-size", str(batch), "--checkpoint.dir", str(c),
             "--resume", str(a / "step_15"), "--json", str(c / "s.json")], 200)
    assert r.rc == 0, r.text
    assert "resumed from" in r.text and "at step 15" in r.text
    full, resumed = (json.loads((d / "s.json").read_text()) for d in (a, c))
    assert resumed["world_size"] == nproc
    assert resumed["loss_last"] == pytest.approx(full["loss_last"], rel=1e-4)
    assert resumed["eval_loss"] == pytest.approx(full["eval_loss"], rel=1e-4)


@pytest.mark.dist
@pytest.mark.timeout(500)
def test_zero_checkpoint_of_2_processes_resumes_on_4_with_the_same_loss(tmp_path):
    # 8 samples each: DCP reshards the 2 optimizer shards into 4.
    _resumed_alike(tmp_path, _two_process_checkpoint(tmp_path), 4, 8)


@pytest.mark.full  # resharding from 2 to 4 above; to one process, the same global batch of 32
@pytest.mark.dist
@pytest.mark.timeout(500)
def test_zero_checkpoint_of_2_processes_resumes_on_1_with_the_same_loss(tmp_path):
    _resumed_alike(tmp_path, _two_process_checkpoint(tmp_path), 1, 32)
