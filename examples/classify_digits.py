"""Classification in the shape of PyTorch's DDP tutorial, on trainscale's run API.

Your own loop, model, loss and optimizer; five lines hand the rest to trainscale: the process group,
DDP with the configured strategy, a sharded and prefetched loader, AMP, accumulation, the
measurements and the run summary.

    trainscale launch --nproc-per-node 2 examples/classify_digits.py --steps 200
    trainscale doctor --nproc 2 -- python examples/classify_digits.py --slow-input-ms 1
    trainscale bench --nproc 1,2 -- python examples/classify_digits.py

``--slow-input-ms`` and ``--slow-rank`` plant a fault (a slow disk, a slow GPU) for the doctor to find. Any
``--section.field VALUE`` argument configures the run (``--strategy.bucket_mb 4``, ``--log.progress none``);
examples/by_feature/ adds one feature each to this script.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import trainscale
from trainscale.data import load_digits_arrays
from trainscale.data.delay import with_sample_delay


class Digits(Dataset):
    """scikit-learn's handwritten digits (8x8, 10 classes), 1,500 to train and 297 to test; scaled to [0, 1]."""

    def __init__(self, train: bool):
        pixels, labels = load_digits_arrays()  # the file scikit-learn ships, read without importing it (~3 s)
        x, y = torch.tensor(pixels, dtype=torch.float32) / 16.0, torch.from_numpy(labels)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        idx = perm[:1500] if train else perm[1500:]
        self.x, self.y = x[idx], y[idx]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--slow-input-ms", type=float, default=0.0,
                   help="planted fault: a disk shared by this machine's processes, this slow per sample read")
    p.add_argument("--slow-rank", type=int, default=-1, help="planted fault: this rank computes slower")
    p.add_argument("--slow-ms", type=float, default=5.0, help="extra compute time per step of --slow-rank")
    args, config = p.parse_known_args()  # the rest: --section.field VALUE for the run

    run = trainscale.init(args=config)                                 # 1. join the group
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    data = Digits(True)
    if args.slow_input_ms:  # planted: one slow disk that every process of this machine reads from
        data = with_sample_delay(data, args.slow_input_ms, scope="node")
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = run.prepare(model, optimizer, loader)  # 2. strategy, sharded loader
    slow = args.slow_rank == run.env.rank
    for x, y in run.batches(loader, steps=args.steps):                # 3. device batches
        loss = nn.functional.cross_entropy(model(x), y)
        if slow:
            time.sleep(args.slow_ms / 1000.0)  # planted: a slower device on this rank
        run.backward(loss)                                             # 4. scaled, accumulated
        run.step()                                                     # 5. optimizer + strategy
    metrics = run.evaluate(Digits(False))
    run.finish()
    if run.is_main:
        print(f"test accuracy {metrics['accuracy']:.3f} on {metrics['samples']} digits")


if __name__ == "__main__":
    main()
