"""The feed on its own: an epoch of this rank's shard, every batch once; the preemption boundary; misuse named."""

from __future__ import annotations

import pytest
import torch
from run_fakes import RecordingGuard, context, one_rank_group, parts
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainscale.config import Config, apply_overrides
from trainscale.train.errors import RunError
from trainscale.train.feed.batches import Feed

env = pytest.fixture(one_rank_group)


def feed_for(env, tmp_path, accum: int = 1, guard=None):
    ctx = context(env, tmp_path, apply_overrides(Config(), {"strategy.grad_accum": accum, "data.workers": 0}),
                  guard)
    return Feed(ctx), ctx, parts(ctx, nn.Linear(1, 1))


def samples(n: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n, dtype=torch.float32)), batch_size=2)


def consume(feed, ctx, p, loader, steps=None, accum: int = 1) -> list[float]:
    """What the loop sees, moving the counters as ``run.step`` would."""
    seen = []
    for (x,) in feed.batches(loader, steps, p):
        seen += x.tolist()
        ctx.state.micro += 1
        if ctx.state.micro == accum:
            ctx.state.micro, ctx.state.step_count = 0, ctx.state.step_count + 1
    return seen


@pytest.mark.timeout(60)
@pytest.mark.parametrize("accum", [1, 2])
def test_one_epoch_yields_every_sample_once(env, tmp_path, accum):
    feed, ctx, p = feed_for(env, tmp_path, accum)
    loader = feed.loader(samples(12), strategy=p.strategy)
    assert feed.loaders == [loader] and feed.global_batch == 2 * 1 * accum  # batch x shards x micro-batches
    seen = consume(feed, ctx, p, loader, accum=accum)
    assert sorted(seen) == [float(i) for i in range(12)]
    assert ctx.state.total_steps == ctx.state.step_count == 6 // accum
    assert p.strategy.grad_sync == [(i + 1) % accum == 0 for i in range(6)]  # exchange on the last micro-batch
    feed.close()


@pytest.mark.timeout(60)
def test_steps_set_where_the_loop_ends_and_the_boundary_stops_it_early(env, tmp_path):
    feed, ctx, p = feed_for(env, tmp_path, guard=RecordingGuard(stop_at=2))
    assert len(consume(feed, ctx, p, feed.loader(samples(40), strategy=p.strategy), steps=5)) == 2 * 2
    assert ctx.state.preempted and ctx.state.step_count == 2 and ctx.state.total_steps == 5
    feed.close()


@pytest.mark.timeout(60)
def test_a_batch_without_a_step_is_named(env, tmp_path):
    feed, ctx, p = feed_for(env, tmp_path)
    batches = feed.batches(feed.loader(samples(8), strategy=p.strategy), 2, p)
    next(batches)
    with pytest.raises(RunError, match=r"call run.step\(\) once for every batch"):
        next(batches)
    feed.close()
