"""The CUDA paths: NCCL, fp16/bf16 AMP, side-stream prefetch, the CUDA-event clock, the profiler on CUDA.

Skipped on machines without CUDA (CI); run on a GPU machine with ``pytest tests/cuda``.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from clitools import FAST, read_json, run_cli
from trainscale.config import Config
from trainscale.data import DataInfo
from trainscale.data.datasets import TensorImages
from trainscale.data.loader import TrainLoader
from trainscale.strategies.amp import apply_amp
from trainscale.train.instruments import ComputeClock, OpProfiler
from trainscale.train.trainer import build_optimizer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")
TINY = ["--model", "resnet18", "--model.width", "8", "--data", "synthetic", "--data.image_size", "32", *FAST]


def test_nccl_process_group_with_one_rank(tmp_path):
    """A launched one-rank job on NCCL trains; the summary says nccl and cuda."""
    r = run_cli(["train", "--nproc", "1", "--job.backend", "nccl", "--steps", "12", *TINY,
                 "--json", str(tmp_path / "s.json")], timeout=300)
    assert r.rc == 0, r.text
    s = read_json(tmp_path / "s.json")
    assert (s["backend"], s["device"], s["world_size"]) == ("nccl", "cuda", 1)
    assert (s["layout"], s["allreduce_calls_per_step"]) == ("bare", 0)  # one rank: no wrapper, no all-reduce


def test_two_processes_on_one_gpu_use_gloo(tmp_path):
    """NCCL refuses two ranks on one GPU; auto picks Gloo on CUDA tensors, and asking for nccl is one clear line."""
    if torch.cuda.device_count() > 1:
        pytest.skip("needs a machine with exactly one GPU")
    r = run_cli(["train", "--nproc", "2", "--steps", "10", *TINY, "--json", str(tmp_path / "s.json")], timeout=300)
    assert r.rc == 0, r.text
    s = read_json(tmp_path / "s.json")
    assert (s["backend"], s["device"], s["world_size"]) == ("gloo", "cuda", 2)
    bad = run_cli(["train", "--nproc", "2", "--job.backend", "nccl", "--steps", "5", *TINY], timeout=120)
    assert bad.rc != 0 and "nccl needs one GPU per process" in bad.err


def test_a_pipeline_over_gloo_on_cuda_is_refused_before_any_process_starts(tmp_path):
    """Gloo's send cannot read CUDA memory: two processes sharing a GPU cannot pipeline; one line says so and
    what to do, and the same pipeline on the CPU of this machine trains."""
    if torch.cuda.device_count() > 1:
        pytest.skip("needs a machine with exactly one GPU")
    pp = ["train", "--nproc", "2", "--strategy.pipeline_stages", "2", "--steps", "6", *FAST]
    r = run_cli([*pp, "--json", str(tmp_path / "s.json")], timeout=120)
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert r.rc == 2 and len(lines) == 1 and "--job.device cpu" in lines[0], r.err
    assert not (tmp_path / "s.json").exists()
    ok = run_cli([*pp, "--job.device", "cpu", "--json", str(tmp_path / "cpu.json")], timeout=300)
    assert ok.rc == 0 and read_json(tmp_path / "cpu.json")["pipeline"]["microbatches"] >= 1, ok.text


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_fp16_scaler_grows_and_backs_off_and_skips_an_overflow_step(fused):
    """With trainscale's fused optimizer the overflow flag stays on the device; the skip must still happen."""
    autocast, scaler = apply_amp("fp16", CUDA)
    model = nn.Linear(16, 4).to(CUDA)
    opt = build_optimizer(model.parameters(), Config()) if fused else torch.optim.SGD(model.parameters(), lr=0.1)
    assert bool(opt.defaults.get("fused")) == fused
    x = torch.randn(8, 16, device=CUDA)
    start = scaler.get_scale()
    for _ in range(scaler.get_growth_interval()):  # finite steps in a row: the scale doubles
        with autocast():
            out = model(x)
        assert out.dtype == torch.float16
        scaler.scale(out.float().pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert scaler.get_scale() == 2 * start
    before = [p.detach().clone() for p in model.parameters()]
    with autocast():
        loss = model(x).float().mean() * float("inf")  # planted overflow: inf gradients
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == start  # backed off by half
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the step was skipped


@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_amp_training_learns(tmp_path, amp):
    r = run_cli(["train", "--strategy.amp", amp, "--steps", "40", *TINY, "--json", str(tmp_path / "s.json")],
                timeout=300)
    assert r.rc == 0, r.text
    s = read_json(tmp_path / "s.json")
    assert s["amp"] == amp and s["device"] == "cuda"
    assert s["loss_last"] < s["loss_first"] and s["eval_accuracy"] > 0.2


def test_bf16_autocast_runs_matmuls_in_bf16():
    autocast, scaler = apply_amp("bf16", CUDA)
    with autocast():
        out = nn.Linear(8, 8).to(CUDA)(torch.randn(2, 8, device=CUDA))
    assert out.dtype == torch.bfloat16 and not scaler.is_enabled()


def test_prefetch_copies_on_a_side_stream_from_pinned_memory():
    """The copy to the device must not run on the compute stream, or it cannot overlap compute."""
    ds = TensorImages(torch.randint(0, 255, (64, 3, 8, 8), dtype=torch.uint8), torch.arange(64))
    info = DataInfo((3, 8, 8), 64, (0.0,) * 3, (1.0,) * 3)
    loader = TrainLoader(ds, info, CUDA, 16, shuffle=False, prefetch=2, workers=1)
    seen = []
    stage = loader.to_device

    def spy(batch):  # noqa: ANN001, ANN202 - records where the real stage runs, then runs it
        seen.append((torch.cuda.current_stream(CUDA), batch[0].is_pinned()))
        return stage(batch)

    loader.to_device = spy
    compute = torch.cuda.current_stream(CUDA)
    got = torch.cat([next(loader)[0] for _ in range(4)])
    loader.close()
    assert torch.equal(got.cpu(), ds.images.float())
    assert seen and all(s != compute for s, _ in seen), "the host-to-device copy ran on the compute stream"
    assert all(pinned for _, pinned in seen), "batches reached the copy unpinned: non_blocking would be synchronous"


class _DeviceSleep(torch.autograd.Function):
    """Forward keeps the GPU busy for ``cycles`` without the host waiting."""

    @staticmethod
    def forward(ctx, x, cycles):  # noqa: ANN001, ANN205
        torch.cuda._sleep(cycles)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        return g, None


def test_compute_clock_reads_device_time_not_host_time():
    cycles = 200_000_000  # a few tens of ms on any current GPU
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    expected = start.elapsed_time(end) / 1000
    clock = ComputeClock(CUDA)
    x = torch.ones(4, device=CUDA, requires_grad=True)
    for _ in range(3):
        clock.start()
        loss = _DeviceSleep.apply(x, cycles).sum()
        clock.watch(loss)
        loss.backward()
        clock.end_step(True)
    vals = clock.values()
    assert len(vals) == 3
    # A host timer would read microseconds here: the host does not wait for the sleeping kernel.
    assert all(0.8 * expected < v < 1.5 * expected for v in vals), (vals, expected)


def test_operator_profiler_reports_device_time(tmp_path):
    prof = OpProfiler(CUDA)
    a = torch.randn(1024, 1024, device=CUDA)
    prof.start()
    for _ in range(5):
        (a @ a).sum().item()
        prof.step_done()
    paths = prof.write(tmp_path, 1)
    data = json.loads(open(paths["profile_json"]).read())
    assert data["device"] == "cuda" and data["steps"] == 5
    mm = [r for r in data["ops"] if r["name"] == "aten::mm"]
    assert mm and mm[0]["self_device_s_per_step"] > 0
    assert "CUDA" in open(paths["profile_table"]).read()
