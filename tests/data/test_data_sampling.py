"""Exactness of the endless loader: each epoch covers the dataset once across ranks; workers never respawn."""

from __future__ import annotations

import os

import pytest
import torch

from trainscale.data import DataInfo, EpochBatchSampler, ShardedSampler, TensorImages, TrainLoader

CPU = torch.device("cpu")


def _ds(n: int) -> TensorImages:
    # Each image's pixels hold its index, so a batch tells which samples it carries.
    idx = torch.arange(n)
    return TensorImages((idx % 256).to(torch.uint8).view(n, 1, 1, 1).expand(n, 1, 2, 2).clone(), idx)


INFO = DataInfo((1, 2, 2), 10, (0.0,), (1.0,))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_one_epoch_two_ranks_uneven_covers_dataset_once(workers):
    n, world, batch = 43, 2, 4  # 43 does not divide by 2 ranks nor by the batch
    per_rank = ShardedSampler(n, 0, world).per_rank  # 22: one padded sample
    seen: list[int] = []
    for rank in range(world):
        loader = TrainLoader(_ds(n), INFO, CPU, batch, rank, world, workers=workers, seed=7, prefetch=2)
        got = []
        for _ in range(loader.batches_per_epoch):
            _, y = loader.next_host()
            got += y.tolist()
        assert len(got) == per_rank
        assert loader.state_dict() == {"epoch": 1, "batch_in_epoch": 0}
        loader.close()
        seen += got
    # The documented padding: the permutation's first (world*per_rank - n) samples are repeated once.
    pad = world * per_rank - n
    assert sorted(set(seen)) == list(range(n))
    assert len(seen) == n + pad
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(7)).tolist()
    assert sorted(i for i in set(seen) if seen.count(i) == 2) == sorted(perm[:pad])


def test_epochs_differ_and_follow_without_end():
    s = ShardedSampler(10, 0, 1, seed=3)
    it = iter(EpochBatchSampler(s, 4))
    keys = [next(it) for _ in range(9)]  # 3 batches per epoch (4, 4, 2), three epochs
    assert [(k.epoch, k.batch, len(k.indices)) for k in keys[:4]] == [(0, 0, 4), (0, 1, 4), (0, 2, 2), (1, 0, 4)]
    assert sorted(sum((k.indices for k in keys[:3]), [])) == list(range(10))
    assert sum((k.indices for k in keys[:3]), []) != sum((k.indices for k in keys[3:6]), [])


class PidImages(TensorImages):
    """Reports which process read each batch (in the labels)."""

    def __getitems__(self, idx):
        x, _ = super().__getitems__(idx)
        return x, torch.full((len(idx),), os.getpid())


@pytest.mark.timeout(120)
def test_workers_are_not_restarted_across_epochs():
    n, batch = 20, 4  # 5 batches per epoch; read 3 epochs
    ds = PidImages(torch.zeros(n, 1, 2, 2, dtype=torch.uint8), torch.zeros(n))
    loader = TrainLoader(ds, INFO, CPU, batch, workers=2, shuffle=True, prefetch=2)
    pids = [loader.next_host()[1][0].item() for _ in range(3 * loader.batches_per_epoch)]
    assert loader.state_dict() == {"epoch": 3, "batch_in_epoch": 0}
    assert loader.workers_started == 1
    assert len(set(pids)) == 2 and os.getpid() not in pids  # the same two worker processes throughout
    loader.close()


def test_digits_are_read_from_scikit_learns_file_without_importing_it():
    import subprocess
    import sys

    import numpy as np
    from sklearn.datasets import load_digits

    from trainscale.data.datasets import load_digits_arrays

    pixels, labels = load_digits_arrays()
    d = load_digits()
    assert np.array_equal(pixels, d.data) and np.array_equal(labels, d.target) and pixels.shape == (1797, 64)
    fresh = subprocess.run([sys.executable, "-c", "import sys; from trainscale.data.datasets import "
                            "load_digits_arrays; load_digits_arrays(); print('sklearn' in sys.modules)"],
                           capture_output=True, text=True, timeout=120)
    assert fresh.stdout.strip() == "False", fresh.stderr[-2000:]  # ~3 s of import saved in every rank
