"""A user's script whose collate function costs 20 ms of CPU a batch, with no loader workers (the doctor's case 3).

    trainscale doctor --nproc 2 -- python benchmarks/campaigns/_slow_collate_job.py

Rank 0's last line is one JSON object: the step time, the data wait's share and the steps run.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

import trainscale


def slow_collate(batch: list, ms: float = 20.0) -> list:
    """default_collate, after ``ms`` of pure-Python work (a tokenizer or an augmentation would do this)."""
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        x += 1
    return default_collate(batch)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--collate-ms", type=float, default=20.0)
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args()
    run = trainscale.init(args=["--data.batch_size", "32"])
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g))
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(data, batch_size=32, shuffle=True, collate_fn=lambda b: slow_collate(b, a.collate_ms))
    model, opt, loader = run.prepare(model, opt, loader)
    for x, y in run.batches(loader, steps=a.steps):
        run.backward(nn.functional.cross_entropy(model(x), y))
        run.step()
    summary = run.finish()
    if run.is_main:
        print(json.dumps({"steps": summary.get("steps"), "step_time_s": summary.get("step_time_s"),
                          "data_wait_frac": summary.get("data_wait_frac"), "collate_ms": a.collate_ms}))


if __name__ == "__main__":
    main()
