"""A Lightning Fabric training script, as Fabric's docs teach it (run it under torchrun).

No trainscale import. Fault switches for trainscale's tests: ``--slow-collate-ms 20`` (a Python collate,
no workers), ``--slow-rank 1`` (that rank's forward 3x slower).

    torchrun --nproc-per-node 2 fabric_train.py --steps 40
"""

import argparse
import os
import time

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate


class Net(nn.Module):
    def __init__(self, width, slow=1.0):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                  nn.Linear(width, 10))
        self.slow = slow

    def forward(self, x):
        t = time.perf_counter()
        out = self.body(x)
        if self.slow > 1:
            time.sleep((time.perf_counter() - t) * (self.slow - 1))
        return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--slow-collate-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    args = p.parse_args()

    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's process count on this node
    fabric = L.Fabric(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto")
    fabric.launch()
    fabric.seed_everything(0)
    model = Net(args.width, 3.0 if fabric.global_rank == args.slow_rank else 1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g))

    def collate(samples):
        time.sleep(args.slow_collate_ms / 1000)
        return default_collate(samples)

    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=args.batch_size, shuffle=True,
                                                 collate_fn=collate if args.slow_collate_ms else None))
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    while step < args.steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            fabric.backward(loss)
            optimizer.step()
            step += 1
            if step == args.steps:
                break
    fabric.print(f"done: {step} steps, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
