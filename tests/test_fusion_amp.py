"""Fusion is reported truthfully; bf16 runs on the CPU; --print-config shows the resolved configuration."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from clitools import FAST, read_json, run_cli
from trainscale.config import JobConfig, StrategyConfig
from trainscale.distributed import init_distributed, shutdown
from trainscale.models import build_model, count_tensors
from trainscale.strategies import apply_ddp, bucket_count


@pytest.fixture
def one_rank_group():
    env = init_distributed(JobConfig(threads=1))
    yield env
    shutdown()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bucket_mb", [0.0, 0.05, 25.0])
def test_reported_bucket_count_equals_allreduce_calls_issued(one_rank_group, bucket_mb):
    model = build_model("resnet18", (3, 16, 16), 10, width=4)
    ddp = apply_ddp(model, one_rank_group, StrategyConfig(bucket_mb=bucket_mb))
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(dist.group.WORLD, counting_hook)
    for _ in range(3):  # DDP rebuilds its buckets after the first step
        calls.clear()
        ddp(torch.randn(4, 3, 16, 16)).sum().backward()
    assert len(calls) == bucket_count(ddp)
    if bucket_mb == 0:
        assert len(calls) == count_tensors(model) == 62
    elif bucket_mb == 25:
        assert len(calls) == 1
    else:
        assert 1 < len(calls) < 62


@pytest.mark.full  # the count itself: test_reported_bucket_count_equals_allreduce_calls_issued
@pytest.mark.dist
@pytest.mark.timeout(120)
def test_summary_reports_calls_per_step(tmp_path):
    common = ["--model", "resnet18", "--model.width", "4", "--data", "synthetic", "--data.image_size", "8",
              "--steps", "3", "--batch-size", "4", "--data.eval_size", "0", *FAST]
    # Overlapped, DDP's buckets (the hook test above counts those per bucket size); not overlapped, the exchange
    # after backward issues its own calls.
    for bucket, overlap, expected in (("25", "true", 1), ("0", "false", 62)):
        out = tmp_path / f"{bucket}-{overlap}.json"
        r = run_cli(["train", "--nproc", "2", "--strategy.bucket_mb", bucket, "--strategy.overlap", overlap,
                     "--json", str(out), *common], timeout=100)
        assert r.rc == 0, r.text
        assert read_json(out)["allreduce_calls_per_step"] == expected


@pytest.mark.timeout(120)
def test_bf16_trains_on_cpu(tmp_path):
    out = tmp_path / "s.json"
    r = run_cli(["train", "--strategy.amp", "bf16", "--steps", "40", "--json", str(out), *FAST], timeout=100)
    assert r.rc == 0, r.text
    s = read_json(out)
    assert s["amp"] == "bf16" and s["loss_last"] < s["loss_first"]


def test_print_config_shows_overrides():
    r = run_cli(["train", "--print-config", "--model", "resnet50", "--strategy.bucket_mb", "8"])
    assert r.rc == 0
    assert 'name = "resnet50"' in r.out and "bucket_mb = 8.0" in r.out and "# fused all-reduce bucket" in r.out
