"""Each strategy that must not change the mathematics ends with the weights of plain synchronous SGD."""

import pytest
from strategies_common import GRAD_BYTES, assert_weights_close, reference_weights, train


@pytest.fixture(scope="module")
def reference():
    return reference_weights()


# Hierarchical all-reduce's weights on 4 processes: tests/clusters/test_nodes.py (nodes from SLURM's variables).
@pytest.mark.full
@pytest.mark.dist
@pytest.mark.timeout(150)
def test_hierarchical_on_two_emulated_nodes_equals_flat(tmp_path, reference):
    # 4 processes, local_size 2: nodes {0,1} and {2,3}; one tensor per bucket so several buckets chain.
    got, s = train(tmp_path, 4, "--strategy.hierarchical", "true", "--strategy.local_size", "2",
                   "--strategy.bucket_mb", "0", timeout=140)
    assert_weights_close(got, reference, what="hierarchical")
    assert s["allreduce_calls_per_step"] == 3 * 6  # reduce-scatter, all-reduce, all-gather per tensor
    # ring volume: 2 x N(L-1)/L inside the node + 2 (N/L)(Q-1)/Q across, with L = Q = 2
    assert s["comm_bytes_per_step"] == pytest.approx(GRAD_BYTES * (0.5 + 0.5 + 0.5), rel=1e-3)


@pytest.mark.dist
@pytest.mark.timeout(150)
def test_comm_groups_and_sharded_optimizer_equal_ddp(tmp_path, reference):
    got, s = train(tmp_path, 2, "--strategy.comm_groups", "2", "--strategy.bucket_mb", "0",
                   "--strategy.shard_optimizer", "true")
    assert_weights_close(got, reference, what="comm_groups 2 + shard_optimizer")
    assert s["allreduce_calls_per_step"] == 6
    # ring all-reduce over P=2: gradient bytes x 2(P-1)/P
    assert s["comm_bytes_per_step"] == GRAD_BYTES * 2 * (2 - 1) / 2
    # momentum is one fp32 tensor per parameter: sharded, the fullest rank holds less than all of it
    assert 0 < s["optim_state_bytes"] < GRAD_BYTES


@pytest.mark.full
@pytest.mark.dist
@pytest.mark.timeout(150)
def test_local_sgd_period_1_equals_ddp(tmp_path, reference):
    # Averaging parameters after every step is linear in SGD with momentum: the same as averaging gradients.
    got, s = train(tmp_path, 2, "--strategy.local_sgd_period", "1")
    assert_weights_close(got, reference, what="local_sgd_period 1")
    assert s["replica_max_diff"] == 0.0
    assert s["comm_bytes_per_step"] == GRAD_BYTES  # parameters all-reduced instead of gradients


@pytest.mark.dist
@pytest.mark.timeout(150)
def test_bucket_autotune_keeps_ddp_weights_and_reports_choice(tmp_path, reference):
    # Candidates small enough to give the tiny mlp different layouts; 1 timed step each after 2 warm-up steps.
    got, s = train(tmp_path, 2, "--strategy.bucket_mb", "auto", "--strategy.bucket_candidates", "0,0.005,1",
                   "--strategy.autotune_steps", "1", "--steps", "9")
    assert_weights_close(got, reference_weights(steps=9), what="bucket_mb auto")
    tune = s["bucket_autotune"]
    assert set(tune["tried"]) == {"0", "0.005", "1"} and tune["chosen_mb"] in (0.0, 0.005, 1.0)
    assert s["bucket_mb"] == tune["chosen_mb"]
    assert s["comm_bytes_per_step"] == GRAD_BYTES  # no hook: from the gradient sizes
    assert s["optim_state_bytes"] == GRAD_BYTES  # not sharded: all momentum on every rank
