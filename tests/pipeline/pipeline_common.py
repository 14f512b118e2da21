"""Shared by the pipeline tests: one-process references in plain PyTorch, and the runs' common arguments."""

from __future__ import annotations

import pytest
import torch

from clitools import FAST
from reference import one_process_sgd

STEPS, GLOBAL_BATCH, LR, WIDTH, DEPTH = 6, 16, 0.1, 32, 3  # depth 3: 4 layers, enough for 4 stages
COMMON = ["--model.name", "mlp", "--model.width", str(WIDTH), "--model.depth", str(DEPTH), "--data.name", "digits",
          "--optim.lr", str(LR), "--optim.momentum", "0.9", "--data.eval_size", "0", *FAST, "--log.every", "1"]
# Micro-batches change the float32 summation order of the gradients (a mean of means), nothing else.
ATOL, RTOL = 1e-5, 1e-5


def reference(steps: int = STEPS, global_batch: int = GLOBAL_BATCH) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process, plain PyTorch, the whole batch at once: (final weights, loss of every step)."""
    return one_process_sgd(steps, global_batch, LR, WIDTH, depth=DEPTH)


def assert_same_training(weights: dict, summary: dict, want: tuple[dict, list[float]], what: str) -> None:
    """The run's final weights and per-step loss curve equal the one-process reference's."""
    ref_w, ref_losses = want
    assert weights.keys() == ref_w.keys()
    for k in ref_w:
        torch.testing.assert_close(weights[k], ref_w[k], atol=ATOL, rtol=RTOL, msg=lambda m, k=k: f"{what} {k}: {m}")
    assert [summary["loss_first"], summary["loss_last"]] == pytest.approx([ref_losses[0], ref_losses[-1]], rel=1e-5)
    if summary["pipeline"]["replicas"] == 1:  # the curve is rank 0's replica's loss (as DDP's is rank 0's share)
        curve = [loss for _, _, loss in summary["loss_curve"]]
        assert curve == pytest.approx(ref_losses[-len(curve):], rel=1e-5), what
