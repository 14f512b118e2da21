"""An accelerate training script, as its docs teach it (run it with accelerate launch, or torchrun).

No trainscale import. Fault switches for trainscale's tests: ``--slow-collate-ms 20`` (a Python collate,
no workers), ``--slow-rank 1`` (that rank's forward 3x slower). ``--stream``: the data as an
``IterableDataset``, which accelerate serves from rank 0 to all (its dispatcher, the default for such a dataset).

    accelerate launch --num_processes 2 --cpu accelerate_train.py --steps 40
"""

import argparse
import time

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, IterableDataset, TensorDataset
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


class Stream(IterableDataset):
    """Samples drawn at random from a tensor dataset, without end."""

    def __init__(self, data):
        self.data = data

    def __iter__(self):
        g = torch.Generator().manual_seed(2)
        while True:
            yield self.data[int(torch.randint(0, len(self.data), (1,), generator=g))]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--slow-collate-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--accum", type=int, default=1, help="gradient_accumulation_steps (accelerator.accumulate)")
    args = p.parse_args()

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accum)
    torch.manual_seed(0)
    model = Net(args.width, 3.0 if accelerator.process_index == args.slow_rank else 1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g))

    def collate(samples):
        time.sleep(args.slow_collate_ms / 1000)
        return default_collate(samples)

    loader = DataLoader(Stream(data) if args.stream else data, batch_size=args.batch_size, shuffle=not args.stream,
                        collate_fn=collate if args.slow_collate_ms else None)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    while step < args.steps:
        for x, y in loader:
            with accelerator.accumulate(model):  # steps and exchanges on every accum-th batch only
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
            step += accelerator.sync_gradients
            if step == args.steps:
                break
    accelerator.print(f"done: {step} steps, loss {loss.item():.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
