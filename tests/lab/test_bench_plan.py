"""The bench's sweep plan: the batch each run gets, and a strong-scaling batch that cannot be kept."""

from __future__ import annotations

import pytest

from trainscale.config import ConfigError
from trainscale.lab.plans import BenchPlan


def test_weak_scaling_keeps_the_users_options():
    plan = BenchPlan((1, 2), repeat=3, scaling="weak", batch_size=32)
    assert plan.run_args(["--model", "mlp"], 2) == ["--model", "mlp", "--timeline"]
    assert plan.total_runs == 6


@pytest.mark.parametrize("nnodes", [1, 2])
def test_strong_scaling_keeps_the_base_points_global_batch_on_every_node_count(nnodes):
    plan = BenchPlan((1, 2, 4), repeat=1, scaling="strong", nnodes=nnodes, batch_size=64)
    for n in plan.nprocs:
        args = plan.run_args([], n)
        per_device = int(args[args.index("--data.batch_size") + 1])
        assert per_device * plan.world(n) == 64 * nnodes  # the base point runs the user's batch on each device


def test_strong_scaling_refuses_a_batch_that_does_not_divide():
    with pytest.raises(ConfigError, match="must divide by every world size"):
        BenchPlan((1, 3), repeat=1, scaling="strong", batch_size=32)
