"""Gradient accumulation: examples/classify_digits.py with ``--strategy.grad_accum`` and a learning rate set
by hand at every optimizer step.

The lines marked ``# NEW`` are the feature; the rest is the base example's loop. With
``--strategy.grad_accum 4`` (the default here), each optimizer step sums the gradients of 4 micro-batches:
``run.backward`` divides the loss by 4, DDP exchanges the gradients on the 4th micro-batch only, and
``run.step()`` steps the optimizer on the 4th (it returns True then). ``steps`` counts optimizer steps, so
``run.batches`` yields ``steps x 4`` micro-batches, and ``run.step_count`` moves once per optimizer step: a
learning rate computed from it is the same for the 4 micro-batches of a step, and each step's value is
used exactly once.

    trainscale launch --nproc-per-node 2 examples/by_feature/gradient_accumulation.py --strategy.grad_accum 4

(A ``torch.optim.lr_scheduler`` works the same way: ``if run.step(): scheduler.step()``.)
"""

from __future__ import annotations

import argparse
import math

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


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:  # NEW
    """Linear warm-up to ``peak`` over ``warmup`` optimizer steps, then cosine decay to 0 at ``steps``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=16, help="per process and micro-batch")
    p.add_argument("--lr", type=float, default=0.1, help="the peak learning rate")
    p.add_argument("--warmup", type=int, default=5, help="optimizer steps of linear warm-up")  # NEW
    args, config = p.parse_known_args()  # the rest: --section.field VALUE for the run

    run = trainscale.init(args=["--strategy.grad_accum", "4", *config])  # NEW: the command line's own N wins
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = DataLoader(digits(train=True), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = run.prepare(model, optimizer, loader)
    lrs, micro = [], 0  # NEW
    for x, y in run.batches(loader, steps=args.steps):  # NEW: steps x run.accum micro-batches
        lr = lr_at(run.step_count, args.steps, args.lr, args.warmup)  # NEW: step_count counts optimizer steps
        for group in optimizer.param_groups:  # NEW
            group["lr"] = lr  # NEW
        run.backward(nn.functional.cross_entropy(model(x), y))  # divided by run.accum
        micro += 1  # NEW
        if run.step():  # NEW: True on the micro-batch that ends an accumulation
            lrs.append(lr)  # NEW
    metrics = run.evaluate(digits(train=False))
    summary = run.finish()
    if run.is_main:
        print(f"{run.step_count} optimizer steps from {micro} micro-batches (grad_accum {run.accum}), "
              f"{summary['global_batch']} samples per step")  # NEW
        print("learning rate per optimizer step: " + " ".join(f"{v:.4f}" for v in lrs))  # NEW
        print(f"loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}; "
              f"test accuracy {metrics['accuracy']:.3f}")


if __name__ == "__main__":
    main()
