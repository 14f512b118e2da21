"""Local SGD or ZeRO in your own loop, chosen on the command line: examples/classify_digits.py with the
run's ``--strategy.*`` arguments passed through and ``run.end_training()`` before evaluation.

The lines marked ``# NEW`` are the feature; the rest is the base example's loop, which does not change.

    trainscale launch --nproc-per-node 2 examples/by_feature/local_sgd_zero.py --strategy.local_sgd_period 4
    trainscale launch --nproc-per-node 2 examples/by_feature/local_sgd_zero.py --strategy.shard_optimizer true

Local SGD (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020): each process steps on its
own gradients and the replicas average their parameters every ``local_sgd_period`` steps, so the processes
exchange 1/period of DDP's bytes; ``run.end_training()`` averages them once more, so evaluation and a saved
model see one model. ZeRO (Rajbhandari et al., SC 2020; PyTorch's ``ZeroRedundancyOptimizer``): each process
keeps the optimizer state of its share of the parameters only; use the optimizer that ``run.prepare`` returns.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainscale
from trainscale.data import load_digits_arrays


def digits(train: bool) -> TensorDataset:
    """scikit-learn's handwritten digits (8x8 pixels, 10 classes): 1,500 to train, 297 to test."""
    pixels, labels = load_digits_arrays()  # the file scikit-learn ships, read without importing it (~3 s a process)
    x, y = torch.tensor(pixels, dtype=torch.float32) / 16.0, torch.from_numpy(labels)
    idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    idx = idx[:1500] if train else idx[1500:]
    return TensorDataset(x[idx], y[idx])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=3e-3)
    args, strategy = p.parse_known_args()  # NEW: the rest, --strategy.* VALUE, configures the run

    run = trainscale.init(args=strategy)  # NEW
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)  # two state tensors per parameter to shard
    loader = DataLoader(digits(train=True), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = run.prepare(model, optimizer, loader)  # NEW: ZeRO returns its own optimizer
    for x, y in run.batches(loader, steps=args.steps):
        run.backward(nn.functional.cross_entropy(model(x), y))
        run.step()  # local SGD: every period-th step averages the replicas; ZeRO: updates this rank's share
    run.end_training()  # NEW: local SGD's replicas averaged into one model before evaluating or saving it
    metrics = run.evaluate(digits(train=False))
    summary = run.finish()
    if run.is_main:
        st = summary["strategy"]  # NEW
        print(f"local_sgd_period {st['local_sgd_period']}, shard_optimizer {st['shard_optimizer']}: "
              f"{summary['comm_bytes_per_step'] / 1024:.1f} KiB exchanged per step, "
              f"optimizer state {summary['optim_state_bytes'] / 1024:.1f} KiB on the fullest process")  # NEW
        print(f"loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}; "
              f"test accuracy {metrics['accuracy']:.3f}")


if __name__ == "__main__":
    main()
