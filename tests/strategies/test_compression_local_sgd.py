"""Compression stays close to DDP and halves the bytes; local SGD replicas agree exactly after averaging only."""

import pytest
from strategies_common import GRAD_BYTES, assert_weights_close, reference_weights, train

# fp16 keeps 11 significant bits, bf16 8: over 6 steps at lr 0.1 the weights move by at most this much.
FP16_ATOL, BF16_ATOL = 2e-3, 2e-2


@pytest.fixture(scope="module")
def reference():
    return reference_weights()


@pytest.mark.full
@pytest.mark.dist
@pytest.mark.timeout(150)
def test_fp16_compression_within_tolerance_and_half_the_bytes(tmp_path, reference):
    got, s = train(tmp_path, 2, "--strategy.compression", "fp16")
    assert_weights_close(got, reference, atol=FP16_ATOL, rtol=0, what="fp16")
    assert s["comm_bytes_per_step"] == GRAD_BYTES * 2 * (2 - 1) / 2 / 2


@pytest.mark.full
@pytest.mark.dist
@pytest.mark.timeout(150)
def test_bf16_with_hierarchical_within_tolerance(tmp_path, reference):
    # Composition: PyTorch-style cast around the hierarchical hook (2 nodes of 1 process).
    got, s = train(tmp_path, 2, "--strategy.compression", "bf16", "--strategy.hierarchical", "true",
                   "--strategy.local_size", "1")
    assert_weights_close(got, reference, atol=BF16_ATOL, rtol=0, what="bf16 + hierarchical")
    assert s["comm_bytes_per_step"] == GRAD_BYTES / 2  # bf16 over the cross-node all-reduce of 2


@pytest.mark.dist
@pytest.mark.timeout(150)
def test_powersgd_sends_fewer_bytes_and_still_learns(tmp_path):
    _, s = train(tmp_path, 2, "--strategy.compression", "powersgd", "--strategy.powersgd_warmup", "2",
                 "--steps", "12", "--log.skip_first", "2")
    # rank 1: a weight of n x m sends n + m numbers (P and Q); the biases (32, 32, 10) go uncompressed
    sent = (32 + 64) + (32 + 32) + (10 + 32) + (32 + 32 + 10)
    assert s["comm_bytes_per_step"] == sent * 4 * 2 * (2 - 1) / 2
    assert s["allreduce_calls_per_step"] == 3  # uncompressed tensors, Ps, Qs
    assert s["loss_last"] < s["loss_first"]


@pytest.mark.dist
@pytest.mark.timeout(200)
@pytest.mark.parametrize("steps,equal", [(7, True), (8, False)])
def test_local_sgd_replicas_equal_right_after_averaging_only(tmp_path, steps, equal):
    # Period 3 without warm-up: PyTorch's averager runs after steps 1, 4, 7.
    _, s = train(tmp_path, 2, "--strategy.local_sgd_period", "3", "--steps", str(steps))
    if equal:
        assert s["replica_max_diff"] == 0.0
    else:
        assert s["replica_max_diff"] > 1e-6
