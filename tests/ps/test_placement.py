"""Shards in a Ray placement group (ps.placement): placed and answering, or one clear error in bounded time."""

from __future__ import annotations

import time

import numpy as np
import pytest

from trainscale.ps.actors import PsActors
from trainscale.ps.record import PsError


@pytest.mark.timeout(60)
def test_spread_places_every_shard_in_its_bundle(ray_local):
    actors = PsActors(learners=0, shards=2, placement="spread", timeout_s=30)
    try:
        assert actors.group is not None
        metas = ray_local.get([sh.reset.remote(np.zeros(3, np.float32), {"lr": 0.1}) for sh in actors.shards],
                              timeout=30)
        assert [m["shard"] for m in metas] == [0, 1]
    finally:
        actors.close()
    assert actors.group is None


@pytest.mark.timeout(60)
def test_strict_spread_on_one_node_fails_at_start_with_one_line(ray_local):
    t0 = time.monotonic()
    with pytest.raises(PsError, match="strict-spread needs one node per shard") as e:
        PsActors(learners=0, shards=2, placement="strict-spread", timeout_s=3)
    assert time.monotonic() - t0 < 20 and "\n" not in str(e.value)
