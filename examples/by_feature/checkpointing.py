"""Resume from a checkpoint: examples/classify_digits.py with ``run.save`` every few steps and ``run.load``.

The lines marked ``# NEW`` are the feature; the rest is the base example's loop. A checkpoint holds the
model, the optimizer's momentum, the step, the loader's place in its shuffled epoch and every rank's random
state, so a second launch that resumes from it ends with the weights of one uninterrupted run:

    trainscale launch --nproc-per-node 2 examples/by_feature/checkpointing.py --steps 30 --save-every 10 --out ck
    trainscale launch --nproc-per-node 2 examples/by_feature/checkpointing.py --steps 30 --save-every 10 \\
        --out ck2 --resume ck/step_10.pt

The second run starts at step 11, and its ``ck2/step_30.pt`` holds the weights of ``ck/step_30.pt``.
``--resume ck`` takes the newest checkpoint in the folder. (``--checkpoint.dir D --checkpoint.every N`` with
``run.checkpoint()`` after each step is the same, on the run's own cadence, as ``trainscale train`` does it.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

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
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--save-every", type=int, default=10, help="optimizer steps between checkpoints")  # NEW
    p.add_argument("--out", default="checkpoints", help="folder of the checkpoints step_N.pt")  # NEW
    p.add_argument("--resume", help="a checkpoint file, or a folder (its newest checkpoint)")  # NEW
    args, config = p.parse_known_args()  # the rest: --section.field VALUE for the run

    run = trainscale.init(args=config)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = DataLoader(digits(train=True), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = run.prepare(model, optimizer, loader)
    if args.resume:  # NEW: after prepare (it restores the sharded loader too), before the first batch
        run.load(args.resume)  # NEW: run.step_count is now the checkpoint's step; batches() goes on from there
    for x, y in run.batches(loader, steps=args.steps):
        run.backward(nn.functional.cross_entropy(model(x), y))
        run.step()
        if run.step_count % args.save_every == 0:  # NEW
            with run.untimed():  # NEW: the write is not step time
                run.save(Path(args.out) / f"step_{run.step_count}.pt")  # NEW: collective; rank 0 writes
    metrics = run.evaluate(digits(train=False))
    summary = run.finish()
    if run.is_main:
        print(f"steps {summary['resumed_from_step'] + 1}..{run.step_count}; test accuracy {metrics['accuracy']:.3f}")


if __name__ == "__main__":
    main()
