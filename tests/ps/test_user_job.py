"""A user's own model, data and loss in the parameter server, through the builders ``trainscale train`` takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import user_job
from test_cli import FIELDS, _env, _left_behind

from trainscale.config import ConfigError
from trainscale.ps.data import as_arrays, infer_info, resolve_loss

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def test_a_torch_dataset_becomes_arrays_and_its_info_is_inferred():
    train, _ = user_job.data()
    arrays = as_arrays(train)
    assert arrays.x.shape == (1200, 16) and arrays.x.dtype == np.float32 and arrays.y.dtype == np.int64
    info = infer_info(arrays)
    assert info.in_shape == (16,) and info.num_classes == 3


def test_loss_by_name():
    assert resolve_loss("cross_entropy") is torch.nn.functional.cross_entropy
    assert resolve_loss("user_job:hinge") is user_job.hinge
    with pytest.raises(ConfigError, match="job.loss"):
        resolve_loss("l2")


@pytest.mark.timeout(180)
def test_cli_trains_the_users_model_on_the_users_data(tmp_path):
    """``trainscale ps --model user_job:build --data user_job:data``: the user's model learns the user's data."""
    mark = uuid.uuid4().hex
    env = _env(mark)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO / "src"), env.get("PYTHONPATH", "")])
    out = tmp_path / "ps.json"
    p = subprocess.run([sys.executable, "-m", "trainscale", "ps", "--mode", "async", "--learners", "2",
                        "--shards", "2", "--steps", "150", "--model", "user_job:build", "--data", "user_job:data",
                        "--ps.lr", "0.1", "--log.progress", "lines", "--log.every", "50", "--json", str(out)],
                       capture_output=True, text=True, timeout=170, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads(out.read_text())
    assert s["parameters"] == user_job.parameters(3)  # the user's model, with classes inferred from the data
    assert all(f in s for f in FIELDS) and s["mode"] == "async" and len(s["timeline"]) == 150
    assert s["updates"] == 150 and s["loss_last"] < s["loss_first"]
    assert "update 150/150" in p.stderr and "async: P=2" in p.stdout
    assert s["eval_accuracy"] > 0.9, s["eval_accuracy"]
    assert _left_behind(mark) == []


@pytest.mark.timeout(60)
def test_a_builder_that_cannot_be_imported_is_one_line():
    p = subprocess.run([sys.executable, "-m", "trainscale", "ps", "--model", "no_such_module:build"],
                       capture_output=True, text=True, timeout=50, env=_env("bad-user"), cwd=REPO)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainscale ps: model.name = 'no_such_module:build'"), p.stderr
