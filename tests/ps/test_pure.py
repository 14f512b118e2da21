"""Delay specs, lr rules, sharding, data streams, order statistics, configuration errors (no Ray)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainscale.config import ConfigError, load_config
from trainscale.costs.collectives import ring_bytes_per_worker, ring_bytes_total
from trainscale.costs.order_stats import harmonic, order_statistic_exp, predicted_update_time, sync_async_ratio
from trainscale.ps.delays import delay_rng, parse_delay
from trainscale.ps.lr_rules import coefficients
from trainscale.ps.sharding import balance
from trainscale.ps.stream import BatchStream

pytestmark = pytest.mark.timeout(30)


def test_delay_specs_parse_and_sample():
    assert parse_delay("none").kind == "none"
    d = parse_delay("exp:0.2")
    rng = delay_rng(0, 1)
    xs = [d.sample(rng, 1, 0.0) for _ in range(4000)]
    assert abs(np.mean(xs) - 0.2) < 0.02 and min(xs) >= 0
    s = parse_delay("shifted-exp:0.1,0.05")
    assert min(s.sample(rng, 0, 0.0) for _ in range(100)) >= 0.1 and s.expected() == pytest.approx(0.15)
    slow = parse_delay("slow:1,3")
    assert slow.sample(rng, 1, 0.01) == pytest.approx(0.02) and slow.sample(rng, 0, 0.01) == 0
    # Seeded: the same learner draws the same delays.
    assert [d.sample(delay_rng(3, 2), 2, 0) for _ in range(3)] == [d.sample(delay_rng(3, 2), 2, 0) for _ in range(3)]


@pytest.mark.parametrize("spec", ["exp", "exp:", "exp:-1", "exp:x", "gauss:1", "shifted-exp:1", "slow:1.5,2",
                                  "slow:0,0.5"])
def test_bad_delay_specs_are_one_line_config_errors(spec):
    with pytest.raises(ConfigError) as e:
        parse_delay(spec)
    assert "ps.delay" in str(e.value) and "\n" not in str(e.value)


def test_slow_rank_must_name_a_learner():
    with pytest.raises(ConfigError, match="RANK"):
        parse_delay("slow:4,2", learners=4)


def test_lr_rules():
    assert coefficients("constant", 0.1, [0, 3]) == pytest.approx([0.05, 0.05])
    assert coefficients("staleness", 0.1, [0, 1, 4]) == pytest.approx([0.1 / 3, 0.1 / 3, 0.025 / 3])
    assert coefficients("distance", 0.1, [0, 2], [0.0, 0.5], c=0.01, lr_max=0.1) == pytest.approx([0.05, 0.01])
    assert coefficients("distance", 0.1, [1], [1e-4], c=0.01, lr_max=0.1) == pytest.approx([0.1])  # capped


def test_balance_by_size_and_round_trip():
    shapes = [(256, 64), (256,), (256, 256), (256,), (10, 256), (10,)]
    layout = balance(shapes, 2)
    sizes = layout.sizes()
    assert sum(sizes) == sum(math.prod(s) for s in shapes) and all(sizes)
    assert layout.shards[0] == (2,)  # the big square matrix alone; everything else on the other
    rng = np.random.default_rng(0)
    tensors = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    back = layout.join(layout.split(tensors))
    assert all(np.array_equal(a, b) for a, b in zip(tensors, back))
    assert all(len(ts) >= 1 for ts in balance(shapes, 6).shards)
    with pytest.raises(ConfigError, match="at most the model's 6 parameter tensors"):
        balance(shapes, 7)


def test_batch_stream_partitions_and_repeats():
    a, b = BatchStream(10, 0, 2, 2, seed=1), BatchStream(10, 1, 2, 2, seed=1)
    first_epoch_a = np.concatenate([a.next() for _ in range(2)])
    assert set(first_epoch_a) <= {0, 2, 4, 6, 8} and len(set(first_epoch_a)) == 4
    assert set(b.next()) <= {1, 3, 5, 7, 9}
    again = BatchStream(10, 0, 2, 2, seed=1)
    assert np.array_equal(again.next(), first_epoch_a[:2])


def test_order_statistics_and_theorem():
    assert harmonic(4) == pytest.approx(25 / 12)
    assert order_statistic_exp(4, 4, 1.0) == pytest.approx(25 / 12)
    assert order_statistic_exp(1, 8, 0.4) == pytest.approx(0.05)
    assert predicted_update_time("k-sync", 8, 4, 1.0) == pytest.approx(harmonic(8) - harmonic(4))
    assert predicted_update_time("async", 8, 1, 0.4) == pytest.approx(0.05)
    assert predicted_update_time("k-batch-sync", 8, 4, 0.4) == pytest.approx(0.2)
    # Seed 002: E[T_sync]/E[T_async] = P E[X_P:P]/E[X].
    assert sync_async_ratio(8) == pytest.approx(predicted_update_time("sync", 8, 8, 1) / predicted_update_time("async", 8, 1, 1))
    assert (ring_bytes_per_worker(100, 4), ring_bytes_total(100, 4)) == (150.0, 600.0)


@pytest.mark.parametrize("argv, key", [
    (["--ps.mode", "k-sync", "--ps.learners", "4", "--ps.k", "5"], "ps.k"),
    (["--ps.mode", "k-async", "--ps.k", "0"], "ps.k"),
    (["--ps.k", "-1"], "ps.k"),
    (["--ps.mode", "gossip"], "ps.mode"),
    (["--ps.mode", "downpour", "--ps.lr_rule", "distance"], "ps.lr_rule"),
    (["--ps.mode", "k-sync", "--ps.learners", "1"], "ps.k"),
])
def test_config_errors(argv, key):
    with pytest.raises(ConfigError) as e:
        load_config(argv)
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


class _SlowStartRay:
    """Ray's start as a busy machine sees it: the raylet misses Ray's fixed 30 s registration window ``fails`` times."""

    def __init__(self, fails: int, message: str = "The current node timed out during startup. This could happen"):
        self.fails, self.message, self.inits, self.shutdowns = fails, message, 0, 0

    def init(self, **kwargs):
        self.inits += 1
        if self.inits <= self.fails:
            raise Exception(self.message)

    def shutdown(self):
        self.shutdowns += 1


def test_a_local_ray_that_misses_its_start_window_is_started_once_more():
    from trainscale.ps.session import _init

    ray = _SlowStartRay(fails=1)
    _init(ray, {"num_cpus": 2}, verbose=False)
    assert (ray.inits, ray.shutdowns) == (2, 1)  # the half-started one is stopped before the second try
    with pytest.raises(Exception, match="timed out during startup"):
        _init(_SlowStartRay(fails=2), {"num_cpus": 2}, verbose=False)  # twice: the error, not a third try
    other = _SlowStartRay(fails=1, message="some other failure")
    with pytest.raises(Exception, match="some other failure"):
        _init(other, {"num_cpus": 2}, verbose=False)
    assert other.inits == 1  # only the start-up timeout is retried
    joined = _SlowStartRay(fails=1)
    with pytest.raises(Exception):  # noqa: B017 - whatever Ray raises for an address with no cluster
        _init(joined, {"address": "10.0.0.1:6379"}, verbose=False)  # a cluster that is not there: no retry
    assert joined.inits == 1
