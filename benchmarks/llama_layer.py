"""The planner's FSDP compute term measured on this GPU, and its forecast of torchtitan's Llama 3.1 8B row.

torchtitan's end-2024 table (benchmarks/llama3_h100_202412_torchtitan.md, Table 1) gives 5762 tokens/s per GPU
for Llama 3.1 8B under FSDP on 8 H100 (bf16, sequence 8192, local batch 2). The held-out table
(``tests/sim/heldout_scaling.json``) forecasts that row's *efficiency* from the datasheet peak x an assumed MFU
of 0.4. Here the compute term is measured instead: one Llama 3.1 8B block (dim 4096, 32 heads, 8 KV heads, FFN
14336, RMSNorm, SwiGLU, causal SDPA) and the output layer with its loss, forward and backward in bf16 on
2 x 8192 tokens, timed with CUDA events. 32 blocks + the output layer give the one-device compute; the planner's
FSDP model (``sim.published.fsdp_times``) adds the all-gathers and reduce-scatters of 8 GPUs on NVLink 4, and
the forecast tokens/s per GPU is set against the published 5762. Not in the measured term: rotary embeddings,
the optimizer step, and the recompute of torchtitan's selective activation checkpointing.
Last stdout line: one JSON object.

    PYTHONPATH=src python benchmarks/llama_layer.py [--iters 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from trainscale.costs.published import fsdp_times  # noqa: E402

POINT_ID = "torchtitan-llama3.1-8b-fsdp-128"
PUBLISHED_TPS_8 = 5762.0  # Table 1, row fsdp: tokens/s per GPU on 8 H100
PUBLISHED_TPS_128 = 5605.0  # Table 3, row fsdp: on 128 H100


class Block(nn.Module):
    """One Llama 3.1 8B transformer block (no rotary embedding: its cost is elementwise and small)."""

    def __init__(self, d: int = 4096, heads: int = 32, kv_heads: int = 8, ffn: int = 14336):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wkv = nn.Linear(d, 2 * kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.w13 = nn.Linear(d, 2 * ffn, bias=False)
        self.w2 = nn.Linear(ffn, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n1(x)
        q = self.wq(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k, v = self.wkv(h).view(b, t, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, d))
        gate, up = self.w13(self.n2(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Head(nn.Module):
    """The final norm, the output layer and the loss."""

    def __init__(self, d: int = 4096, vocab: int = 128256):
        super().__init__()
        self.norm, self.out = nn.RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.out(self.norm(x)).flatten(0, 1).float(), target.flatten())


def time_fwd_bwd(module: nn.Module, args: tuple, iters: int) -> float:
    """Median seconds of forward + backward, CUDA events around each, after three warm-ups."""
    x = args[0]
    times = []
    for i in range(iters + 3):
        module.zero_grad(set_to_none=True)
        x.grad = None
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        out = module(*args)
        out.float().sum().backward()
        t1.record()
        t1.synchronize()
        if i >= 3:
            times.append(t0.elapsed_time(t1) / 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=10, help="timed forward + backward passes of each part")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("llama_layer.py needs a CUDA GPU: it measures the compute term on one")
    point = next(p for p in json.loads((REPO / "tests/sim/heldout_scaling.json").read_text())["points"]
                 if p["id"] == POINT_ID)
    m = dict(point["model"])
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(2, 8192, 4096, device=dev, dtype=bf16, requires_grad=True)
    block = Block().to(dev, bf16)
    layer_s = time_fwd_bwd(block, (x,), a.iters)
    del block
    head = Head().to(dev, bf16)
    target = torch.randint(128256, (2, 8192), device=dev)
    head_s = time_fwd_bwd(head, (x, target), a.iters)
    compute_s = m["layers"] * layer_s + head_s
    # The planner's compute is tokens x FLOPs per token / (peak x mfu): the measured step sets its mfu.
    flops = m["tokens_per_step"] * (m["linear_flops_per_token"] + m["attention_flops_per_token"])
    peak = 989e12  # the catalogue's H100 bf16 dense peak, the point's GPU
    m["mfu"] = flops / compute_s / peak
    t8, t128 = fsdp_times(m, 8), fsdp_times(m, 128)
    tps8, tps128 = m["tokens_per_step"] / t8.step_s, m["tokens_per_step"] / t128.step_s
    print(f"{torch.cuda.get_device_name()}: one block fwd+bwd {layer_s * 1e3:.1f} ms, output layer + loss "
          f"{head_s * 1e3:.1f} ms -> one-device compute {compute_s:.3f} s per 16,384 tokens (MFU {m['mfu']:.3f})")
    print(f"forecast on 8 H100: step {t8.step_s:.3f} s, {tps8:.0f} tokens/s per GPU against the published "
          f"{PUBLISHED_TPS_8:.0f} ({100 * (tps8 / PUBLISHED_TPS_8 - 1):+.1f}%)", flush=True)
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "layer_s": layer_s, "head_s": head_s,
                      "compute_s": compute_s, "measured_mfu": m["mfu"], "step_s_8": t8.step_s,
                      "exposed_comm_s_8": t8.exposed_s, "tps_per_gpu_8": tps8, "published_tps_per_gpu_8": PUBLISHED_TPS_8,
                      "error_8": tps8 / PUBLISHED_TPS_8 - 1, "tps_per_gpu_128": tps128,
                      "published_tps_per_gpu_128": PUBLISHED_TPS_128, "error_128": tps128 / PUBLISHED_TPS_128 - 1,
                      "iters": a.iters, "point": POINT_ID}))


if __name__ == "__main__":
    main()
