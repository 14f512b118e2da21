"""Model FLOPs as the run counts them (``train/instruments/flops.py``) against the analytic counts, and the device peak.

MLP: a Linear layer costs ``2 * batch * in * out`` forward; backward computes the weight gradient (the same
again) and, where the input needs a gradient, the input gradient (the same again): ``3x`` forward in all, ``2x``
for a first layer. GPT: per token, ``6 * N + 12 * L * d * T`` (nanoGPT's and PaLM's formula), N the parameters
without the position embedding (the tied token embedding counted once, as the output layer), L layers, d the
width, T the context; attention counted whole, not halved for the causal mask.
"""

from __future__ import annotations

import runpy

import pytest
import torch
from torch import nn

from clitools import REPO
from trainscale.train.instruments.flops import FlopCount, count_flops
from trainscale.train.instruments.peak import catalog_peak, device_peak, measured_peak


def test_an_mlp_counts_exactly_the_analytic_flops():
    sizes, batch = [12, 32, 24, 5], 7
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    net = nn.Sequential(*layers[:-1])
    x = torch.randn(batch, sizes[0])
    got = count_flops(lambda: net(x).sum().backward())
    want = sum(2 * batch * a * b * (2 if i == 0 else 3) for i, (a, b) in enumerate(zip(sizes, sizes[1:])))
    assert got == want


def test_the_step_counter_counts_between_start_and_stop_only():
    net, x = nn.Linear(8, 4), torch.randn(3, 8)
    count = FlopCount()
    net(x)  # before start: not counted
    count.start()
    net(x).sum().backward()
    assert count.stop() == 2 * 3 * 8 * 4 * 2  # forward + weight gradient (x needs none)
    net(x)
    assert count.flops == 2 * 3 * 8 * 4 * 2 and not count.active


def test_the_gpt_is_within_2_percent_of_6_n_plus_attention():
    gpt = runpy.run_path(str(REPO / "examples" / "gpt.py"), run_name="gpt_example")
    vocab, block, layers, heads, d, batch = 36, 64, 4, 4, 128, 8
    model = gpt["GPT"](vocab, block, layers, heads, d)
    ids = torch.randint(vocab, (batch, block))
    got = count_flops(lambda: gpt["next_token_loss"](model(ids), ids).backward())
    n = sum(p.numel() for p in model.parameters()) - model.pos.weight.numel()
    tokens = batch * block
    want = 6 * n * tokens + 12 * layers * d * block * tokens
    assert got == pytest.approx(want, rel=0.02)
    assert got > 6 * n * tokens * 1.05  # the CPU attention kernels are counted (torch's table lacks them)


def test_the_cpu_peak_is_measured_once_per_process():
    peak = device_peak(torch.device("cpu"), "none")
    assert peak.flops > 1e8 and peak.source == "measured: fp32 matmul on this cpu rank"
    assert measured_peak.cache_info().hits + measured_peak.cache_info().misses >= 1
    assert device_peak(torch.device("cpu"), "none").flops == peak.flops  # cached: no second benchmark
    assert device_peak(torch.device("cpu"), "bf16").source.startswith("measured: bf16")


def test_a_gpu_peak_comes_from_the_planners_catalogue():
    h100 = catalog_peak("NVIDIA H100 80GB HBM3", "bf16")
    assert h100 is not None and h100.flops == 989e12 and h100.source == "catalog: H100 bf16"
    assert catalog_peak("NVIDIA A100-SXM4-80GB", "tf32").flops == 156e12  # type: ignore[union-attr]
    # As torch names the lent H200; before it was catalogued its peak was measured at a twelfth of this.
    assert catalog_peak("NVIDIA H200", "fp16").flops == 989e12  # type: ignore[union-attr]
    assert catalog_peak("NVIDIA GeForce RTX 4090", "fp32") is None  # not in the catalogue: measured instead
    assert catalog_peak("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 peak there


def test_counting_a_compiled_model_leaves_it_compiled():
    # Dynamo compiles nothing under an ordinary dispatch mode, and then never compiles that code again; the
    # run's counter lets it compile. backend="eager": dynamo's decision is the same, without inductor's minutes.
    import torch._dynamo.utils as du

    net, x = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)), torch.randn(5, 8)
    eager = count_flops(lambda: net(x).sum().backward())
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="eager")
    assert count_flops(lambda: compiled(x).sum().backward()) == eager
    assert du.counters["stats"]["unique_graphs"] >= 1  # traced while counting, not skipped
    torch._dynamo.reset()
