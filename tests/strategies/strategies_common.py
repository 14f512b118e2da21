"""Shared by the strategy tests: one reference computed in plain PyTorch, and a launched run's results."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from clitools import FAST, run_cli
from reference import one_process_sgd

STEPS, GLOBAL_BATCH, LR, WIDTH = 6, 16, 0.1, 32
COMMON = ["--model", "mlp", "--model.width", str(WIDTH), "--data", "digits", "--steps", str(STEPS),
          "--optim.lr", str(LR), "--optim.momentum", "0.9", "--data.eval_size", "0", *FAST]
# mlp width 32 on 8x8 digits: 64*32+32 + 32*32+32 + 32*10+10 parameters, fp32.
GRAD_BYTES = (64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10) * 4
# Different summation orders (ranks, levels, groups) change float32 rounding only.
ATOL, RTOL = 2e-6, 1e-5


def reference_weights(steps: int = STEPS, global_batch: int = GLOBAL_BATCH) -> dict[str, torch.Tensor]:
    """One process, plain PyTorch: what synchronous data parallelism must reproduce."""
    return one_process_sgd(steps, global_batch, LR, WIDTH)[0]


def train(tmp: Path, nproc: int, *extra: str, timeout: float = 150) -> tuple[dict[str, torch.Tensor], dict]:
    """Launch ``trainscale train`` on ``nproc`` processes (same global batch); return (final weights, summary)."""
    out = tmp / "run.json"
    r = run_cli(["train", "--nproc", str(nproc), "--batch-size", str(GLOBAL_BATCH // nproc), "--checkpoint.dir",
                 str(tmp), "--json", str(out), *COMMON, *extra], timeout=timeout)
    assert r.rc == 0, r.text[-3000:]
    return torch.load(tmp / "last.pt", weights_only=True)["model"], json.loads(out.read_text())


def assert_weights_close(got: dict, want: dict, atol: float = ATOL, rtol: float = RTOL, what: str = "") -> None:
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=atol, rtol=rtol, msg=lambda m, k=k: f"{what} {k}: {m}")
