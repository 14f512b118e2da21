"""Checkpoints resume bit-identically; distributed evaluation is exact for uneven shards."""

import pytest
import torch

from clitools import FAST, read_json, run_cli
from trainscale.config import DataConfig
from trainscale.data import DeviceNormalize, build_datasets
from trainscale.models import build_model

JOB = ["--model", "mlp", "--model.width", "32", "--data", "digits", "--batch-size", "16", *FAST]


@pytest.mark.full  # resumes bit for bit: tests/survive/test_faults.py (kill -9, SIGTERM), tests/data/test_data_resume.py
@pytest.mark.dist
@pytest.mark.timeout(240)
def test_stopped_and_resumed_equals_uninterrupted_bit_for_bit(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    # 1,500 samples / (2 x 16) = 47 steps per epoch: the run crosses an epoch boundary after the resume point.
    r = run_cli(["train", "--nproc", "2", "--steps", "60", "--checkpoint.dir", str(a), "--checkpoint.every", "30",
                 "--checkpoint.keep", "5", *JOB], timeout=200)
    assert r.rc == 0, r.text
    assert (a / "step_30.pt").is_file()
    r = run_cli(["train", "--nproc", "2", "--steps", "60", "--checkpoint.dir", str(b), "--resume", str(a / "step_30.pt"),
                 *JOB], timeout=200)
    assert r.rc == 0, r.text
    assert "resumed from" in r.text
    full, resumed = (torch.load(p / "last.pt", weights_only=True) for p in (a, b))
    assert full["step"] == resumed["step"] == 60
    for k, v in full["model"].items():
        assert torch.equal(v, resumed["model"][k]), f"{k} differs after resume"
    for sa, sb in zip(full["optimizer"]["state"].values(), resumed["optimizer"]["state"].values()):
        assert torch.equal(sa["momentum_buffer"], sb["momentum_buffer"])
    assert full["loader"] == resumed["loader"]


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_distributed_eval_is_exact_on_uneven_shards(tmp_path):
    # 297 eval samples, 2 ranks, batch 16: shards of 149 and 148, last batches partial.
    r = run_cli(["train", "--nproc", "2", "--steps", "10", "--json", str(tmp_path / "s.json"),
                 "--checkpoint.dir", str(tmp_path), *JOB], timeout=100)
    assert r.rc == 0, r.text
    s = read_json(tmp_path / "s.json")
    assert s["eval_samples"] == 297
    _, evals, info = build_datasets(DataConfig(name="digits"))
    model = build_model("mlp", info.in_shape, info.num_classes, width=32)
    model.load_state_dict(torch.load(tmp_path / "last.pt", weights_only=True)["model"])
    x, y = DeviceNormalize(info, torch.device("cpu"))((evals.images, evals.labels))
    with torch.no_grad():
        out = model(x)
    hits = int((out.argmax(1) == y).sum())
    assert s["eval_accuracy"] == hits / 297
    assert abs(s["eval_loss"] - torch.nn.functional.cross_entropy(out, y).item()) < 1e-5
