"""A checkpoint folder that turns read-only or fills up: one line, and the previous checkpoint still loads."""

import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

import trainscale
from trainscale.train.checkpoint.files import CheckpointWriteError, load_checkpoint, read_latest


def _tmpfs(path: Path, size: str) -> bool:
    """Mount a tiny tmpfs (root only); False where the machine does not allow it."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", f"ts{uuid.uuid4().hex[:6]}", str(path)],
                       capture_output=True, timeout=20)
    return r.returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=20)


@pytest.fixture
def ck_folder(tmp_path):
    """``ck_folder(size)`` -> (folder, mounted): the checkpoint folder, on a tmpfs of ``size`` where root may
    mount one (unmounted after the test); a plain folder otherwise, and the test simulates the kernel's error."""
    mounted: list[Path] = []

    def make(size: str) -> tuple[Path, bool]:
        folder = tmp_path / "ck"
        if os.geteuid() == 0 and _tmpfs(folder, size):
            mounted.append(folder)
        return folder, bool(mounted)

    yield make
    for folder in mounted:
        _umount(folder)


@pytest.fixture
def api_run(ck_folder):
    """A 2-step run on the run API (one process), finished after the test, before its folder is unmounted."""
    run = trainscale.init(args=["--log.progress", "none", "--job.heartbeat_s", "0"])
    model = torch.nn.Linear(64, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 64), torch.randn(64, 256)),
                                       batch_size=16)
    model, opt, loader = run.prepare(model, opt, data)
    for x, y in run.batches(loader, steps=2):
        run.backward(torch.nn.functional.mse_loss(model(x), y))
        run.step()
    try:
        yield run
    finally:
        run.finish()


def _check_one_line_and_previous_loads(err: CheckpointWriteError, folder: Path) -> None:
    line = str(err)
    assert "\n" not in line and str(folder) in line and "step_2.pt" in line and "needs about" in line, line
    assert "step_1.pt is intact" in line, line
    assert read_latest(folder) == "step_1.pt"
    assert load_checkpoint(folder / "step_1.pt")["step"] == 1


@pytest.mark.timeout(120)
def test_read_only_folder_mid_run(ck_folder, api_run, monkeypatch):
    folder, mounted = ck_folder("4m")
    api_run.step_count = 1
    api_run.save(folder / "step_1.pt")
    if mounted:
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, timeout=20)
    else:  # no mount here: the same error as the kernel's
        import tempfile

        def ro(*a, **k):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        monkeypatch.setattr(tempfile, "mkstemp", ro)
    _second_save_fails(api_run, folder, monkeypatch, "Read-only file system")


def _second_save_fails(api_run, folder, monkeypatch, reason: str) -> None:
    """Step 2's save fails with ``reason`` in one clear error; step 1's checkpoint still loads."""
    api_run.step_count = 2
    with pytest.raises(CheckpointWriteError) as e:
        api_run.save(folder / "step_2.pt")
    assert reason in str(e.value)
    monkeypatch.undo()
    _check_one_line_and_previous_loads(e.value, folder)


@pytest.mark.timeout(120)
def test_full_folder(ck_folder, api_run, monkeypatch):
    # One checkpoint of this model is ~200 KB (weights + momentum): a 300 KB file system holds one, not two.
    folder, mounted = ck_folder("300k")
    api_run.step_count = 1
    api_run.save(folder / "step_1.pt")
    if not mounted:  # no tmpfs here: a simulated ENOSPC from the file system
        import shutil
        real = shutil.disk_usage
        monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    _second_save_fails(api_run, folder, monkeypatch, "No space left on device")
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]  # no half-written file left


@pytest.mark.timeout(120)
def test_on_error_warn_trains_on_and_cli_says_one_line(tmp_path):
    from survive_jobs import run as run_job
    folder = tmp_path / "ck"
    folder.write_text("a file where the folder should be")  # unwritable for root too
    r = run_job(["train", "--model", "mlp", "--model.width", "16", "--steps", "4", "--checkpoint.every", "2",
                 "--checkpoint.dir", str(folder), "--log.progress", "none"], timeout=100)
    assert r.rc == 2, r.text
    lines = [ln for ln in r.text.splitlines() if ln.startswith("trainscale train:")]
    assert len(lines) == 1 and "checkpoint.dir" in lines[0] and "cannot write step_2.pt" in lines[0], r.text
    assert "Traceback" not in r.text
    r = run_job(["train", "--model", "mlp", "--model.width", "16", "--steps", "4", "--checkpoint.every", "2",
                 "--checkpoint.dir", str(folder), "--checkpoint.on_error", "warn", "--log.progress", "none"], 100)
    assert r.rc == 0, r.text
    assert "training on (checkpoint.on_error = warn)" in r.text
