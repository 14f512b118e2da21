"""Resume: a loader restored from a checkpointed position yields the same next batches, augmentation included."""

from __future__ import annotations

import pytest
import torch
from imgutil import FAST, make_folder, run_cli

from trainscale.config import DataConfig
from trainscale.data import TrainLoader, build_datasets

CPU = torch.device("cpu")


def _loader(folder, workers: int, prefetch: int) -> TrainLoader:
    train, _, info = build_datasets(DataConfig(name="imagefolder", path=str(folder), image_size=16))
    return TrainLoader(train, info, CPU, 8, rank=1, world=2, workers=workers, seed=5, prefetch=prefetch)


@pytest.mark.timeout(180)
def test_resume_mid_epoch_gives_the_same_next_batches(tmp_path):
    folder = make_folder(tmp_path / "img")  # 42 images: 21 per rank, 3 batches of 8/8/5 per epoch
    ref = _loader(folder, workers=0, prefetch=0)
    batches = [next(ref) for _ in range(8)]  # crosses two epoch boundaries
    ref.close()
    run = _loader(folder, workers=2, prefetch=3)
    for i in range(4):  # stopped mid-epoch 1, with batches produced ahead by workers and prefetcher
        x, y = next(run)
        assert torch.equal(x, batches[i][0]) and torch.equal(y, batches[i][1])
    state = run.state_dict()
    assert state == {"epoch": 1, "batch_in_epoch": 1}  # what was consumed, not what was produced
    run.close()
    resumed = _loader(folder, workers=1, prefetch=2)
    resumed.load_state_dict(state)
    for i in range(4, 8):
        x, y = next(resumed)
        assert torch.equal(x, batches[i][0]) and torch.equal(y, batches[i][1]), f"batch {i} differs"
    resumed.close()


@pytest.mark.full
@pytest.mark.dist
@pytest.mark.timeout(300)
def test_training_resumed_from_imagefolder_equals_uninterrupted(tmp_path):
    folder = make_folder(tmp_path / "img", per_class=10)  # 30 images, 2 ranks x batch 4: 4 steps per epoch
    job = ["--model", "mlp", "--model.width", "16", "--data", "imagefolder", "--data.path", str(folder),
           "--data.image_size", "8", "--batch-size", "4", "--data.workers", "1", "--data.prefetch", "2",
           "--steps", "10", *FAST]
    a, b = tmp_path / "a", tmp_path / "b"
    r = run_cli(["train", "--nproc", "2", "--checkpoint.dir", str(a), "--checkpoint.every", "5",
                 "--checkpoint.keep", "3", *job], timeout=240)
    assert r.rc == 0, r.text
    r = run_cli(["train", "--nproc", "2", "--checkpoint.dir", str(b), "--resume", str(a / "step_5.pt"), *job],
                timeout=240)
    assert r.rc == 0, r.text
    full, resumed = (torch.load(p / "last.pt", weights_only=True) for p in (a, b))
    assert full["loader"] == resumed["loader"]
    for k, v in full["model"].items():
        assert torch.equal(v, resumed["model"][k]), f"{k} differs after resume"
