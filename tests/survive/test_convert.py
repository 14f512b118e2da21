"""`trainscale checkpoint convert`: a .pt file to a sharded DCP folder and back, and resuming from either."""

import errno

import pytest
import torch
from survive_jobs import same_weights, weights

from trainscale.config import ConfigError
from trainscale.train.checkpoint.convert import convert_checkpoint
from trainscale.train.checkpoint.dcp import read_all
from trainscale.train.checkpoint.files import is_sharded

# 9 steps with AdamW (its state holds a scalar step besides two tensors per parameter), a checkpoint every 3.
JOB = ["--model", "mlp", "--model.width", "16", "--data", "digits", "--batch-size", "16", "--steps", "9",
       "--checkpoint.every", "3", "--checkpoint.keep", "5", "--optim.name", "adamw", "--log.progress", "none"]


def _dcp_weights(folder):
    return {k[len("model/"):]: v for k, v in read_all(folder).items() if k.startswith("model/")}


def _train(*extra, resume=None):
    """``trainscale train JOB EXTRA [--resume RESUME]`` in this process (one rank): its summary."""
    from trainscale.distributed import shutdown
    from trainscale.train.cli import parse
    from trainscale.train.trainer import Trainer

    _, cfg = parse([*JOB, *extra])
    try:
        return Trainer(cfg, resume=resume).fit()
    finally:
        shutdown()


@pytest.mark.timeout(240)
def test_convert_both_ways_and_resume_to_the_same_weights(tmp_path):
    a, b, c, d, e = (tmp_path / x for x in "abcde")
    _train("--checkpoint.dir", str(a))  # uninterrupted, one-file checkpoints

    # .pt -> sharded, then resume from the folder (writing sharded checkpoints) to the end.
    assert convert_checkpoint(a / "step_3.pt", d / "step_3")["step"] == 3
    assert is_sharded(d / "step_3") and [p.name for p in d.iterdir()] == ["step_3"]  # no temporary left
    s = _train("--checkpoint.format", "dcp", "--checkpoint.dir", str(b), resume=str(d / "step_3"))
    assert s["resumed_from_step"] == 3 and s["steps"] == 9
    full, resumed = weights(a / "last.pt"), _dcp_weights(b / "last")
    assert full.keys() == resumed.keys() and all(torch.equal(full[k], resumed[k]) for k in full)

    # sharded (as training wrote it) -> .pt, then resume from the file.
    convert_checkpoint(b / "step_6", e / "step_6.pt")
    s = _train("--checkpoint.dir", str(c), resume=str(e / "step_6.pt"))
    assert s["resumed_from_step"] == 6
    assert same_weights(a / "last.pt", c / "last.pt")


def test_bad_sources_and_destinations_are_one_line_and_write_nothing(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="no such file or folder"):
        convert_checkpoint(tmp_path / "missing.pt", tmp_path / "out")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match="not a sharded checkpoint"):
        convert_checkpoint(tmp_path / "plain", tmp_path / "out.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="not a readable checkpoint"):
        convert_checkpoint(tmp_path / "junk.pt", tmp_path / "out")
    torch.save({"model": {"w": torch.ones(2)}, "optimizer": {}, "step": 1}, tmp_path / "ok.pt")
    with pytest.raises(ConfigError, match="give a name without .pt"):
        convert_checkpoint(tmp_path / "ok.pt", tmp_path / "out.pt")
    with pytest.raises(ConfigError, match="already exists"):
        convert_checkpoint(tmp_path / "ok.pt", tmp_path / "plain")

    import torch.distributed.checkpoint as dcp

    def full_disk(state, checkpoint_id, **kw):  # a file system that fills up halfway through the write
        (tmp_path / checkpoint_id).mkdir()
        (tmp_path / checkpoint_id / "__0_0.distcp").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp, "save", full_disk)
    with pytest.raises(ConfigError, match="No space left on device.*nothing was left behind"):
        convert_checkpoint(tmp_path / "ok.pt", tmp_path / "sharded")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.pt", "ok.pt", "plain"]


def test_cli_says_what_is_wrong_in_one_line(tmp_path, capsys):
    from trainscale.cli import main

    assert main(["checkpoint", "convert", str(tmp_path / "nope"), str(tmp_path / "x.pt")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("trainscale checkpoint: SRC"), err
    assert "no such file or folder" in err and not (tmp_path / "x.pt").exists()
