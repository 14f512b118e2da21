"""2-process ddp ends with the weights of one process training on the concatenated batches."""

from pathlib import Path

import pytest
import torch

from clitools import FAST, run_cli
from trainscale.config import DataConfig
from trainscale.data import DeviceNormalize, ShardedSampler, build_datasets
from trainscale.models import build_model

STEPS, BATCH, LR = 8, 8, 0.1
# Summation order differs between one process and an all-reduce of two halves: float32 rounding only.
ATOL, RTOL = 2e-6, 1e-5
COMMON = ["--model", "mlp", "--model.width", "32", "--data", "digits", "--steps", str(STEPS),
          "--optim.lr", str(LR), "--optim.momentum", "0.9", "--data.eval_size", "0", *FAST]


def reference_weights(global_batch: int) -> dict[str, torch.Tensor]:
    """Plain PyTorch, one process, no trainscale loop: the same samples per step, SGD with momentum."""
    torch.manual_seed(0)
    train, _, info = build_datasets(DataConfig(name="digits"))
    model = build_model("mlp", info.in_shape, info.num_classes, width=32)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    order = list(ShardedSampler(len(train), 0, 1, shuffle=True, seed=0))
    norm = DeviceNormalize(info, torch.device("cpu"))
    for step in range(STEPS):
        idx = order[step * global_batch:(step + 1) * global_batch]
        x, y = norm(train.__getitems__(idx))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.state_dict()


def final_weights(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(folder / "last.pt", weights_only=True)["model"]


@pytest.fixture(scope="module")
def reference():
    return reference_weights(2 * BATCH)


@pytest.mark.dist
@pytest.mark.timeout(180)
# Per-tensor buckets alone are checked through the run API (tests/runapi), on the same Strategy object.
@pytest.mark.parametrize("extra", [
    [],
    # one bucket per tensor: tests/strategies/test_parity.py (bucket_mb 0), tests/test_fusion_amp.py (the count)
    pytest.param(["--strategy.bucket_mb", "0", "--strategy.overlap", "false"], marks=pytest.mark.full),
    pytest.param(["--strategy.grad_accum", "2"], marks=pytest.mark.full),  # the user loop's grad-accum-2 stays
], ids=["default", "per-tensor-no-overlap", "grad-accum-2"])
def test_two_process_ddp_equals_one_process_on_concatenated_batches(tmp_path, reference, extra):
    batch = BATCH // 2 if "--strategy.grad_accum" in extra else BATCH
    r = run_cli(["train", "--nproc", "2", "--batch-size", str(batch), "--checkpoint.dir", str(tmp_path),
                 *COMMON, *extra], timeout=150)
    assert r.rc == 0, r.text
    got = final_weights(tmp_path)
    assert got.keys() == reference.keys()
    for k in reference:
        torch.testing.assert_close(got[k], reference[k], atol=ATOL, rtol=RTOL, msg=f"{k} differs ({extra})")


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_one_process_trainscale_equals_plain_pytorch(tmp_path, reference):
    r = run_cli(["train", "--batch-size", str(2 * BATCH), "--checkpoint.dir", str(tmp_path), *COMMON], timeout=100)
    assert r.rc == 0, r.text
    got = final_weights(tmp_path)
    for k in reference:
        torch.testing.assert_close(got[k], reference[k], atol=ATOL, rtol=RTOL)
