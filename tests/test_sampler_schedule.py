"""Sharded sampling and the learning-rate schedule (pure code)."""

import torch

from trainscale.config import OptimConfig
from trainscale.data import ShardedSampler, eval_indices
from trainscale.train.schedule import lr_at


def test_ranks_are_disjoint_and_cover_the_epoch_with_documented_padding():
    n, world = 101, 2
    shards = [ShardedSampler(n, r, world, shuffle=True, seed=3) for r in range(world)]
    seen = [list(s) for s in shards]
    assert len(seen[0]) == len(seen[1]) == 51          # equal steps on every rank: no hang
    union = seen[0] + seen[1]
    assert set(union) == set(range(n))                # every sample is seen
    assert len(union) - n == 1                         # exactly the one padded repeat


def test_permutation_does_not_depend_on_world_size():
    one = list(ShardedSampler(64, 0, 1, seed=5))
    two = [list(ShardedSampler(64, r, 2, seed=5)) for r in range(2)]
    interleaved = [x for pair in zip(*two) for x in pair]
    assert interleaved == one


def test_resume_offset_and_epochs():
    s = ShardedSampler(50, 1, 2, seed=1)
    s.set_epoch(3)
    full = list(s)
    s.set_epoch(3, start=7)
    assert list(s) == full[7:]
    s.set_epoch(4)
    assert list(s) != full


def test_eval_indices_have_no_padding():
    parts = [eval_indices(297, r, 2) for r in range(2)]
    assert sorted(parts[0] + parts[1]) == list(range(297))


def test_linear_scaling_and_warmup():
    cfg = OptimConfig(lr=0.1, lr_scaling="linear", base_batch=32, warmup_steps=4)
    assert abs(lr_at(100, cfg, 128, 200) - 0.4) < 1e-12       # 0.1 x 128 / 32
    ramp = [lr_at(s, cfg, 128, 200) for s in range(4)]
    assert ramp == sorted(ramp) and abs(ramp[-1] - 0.4) < 1e-12 and ramp[0] > 0.1
    plain = OptimConfig(lr=0.1, warmup_steps=2)
    assert [lr_at(s, plain, 999, 10) for s in range(3)] == [0.05, 0.1, 0.1]
    assert torch.isclose(torch.tensor(lr_at(10, OptimConfig(lr=1.0, schedule="cosine"), 32, 10)), torch.tensor(0.0))
