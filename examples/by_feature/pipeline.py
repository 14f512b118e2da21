"""Pipeline parallelism: examples/classify_digits.py with the model split across the processes and
``run.forward_backward`` in place of ``model(x)`` and ``run.backward``.

The lines marked ``# NEW`` are the feature; the rest is the base example's loop. With
``--strategy.pipeline_stages 2`` (the default here) each process holds one stage, a run of the
``nn.Sequential``'s layers cut where the measured compute is balanced, and ``run.forward_backward`` sends
each batch through the schedule in ``strategy.microbatches`` micro-batches (1F1B by default;
torch.distributed.pipelining). It returns the loss on the last stage and None on the others; without a
pipeline it is ``run.backward(loss_fn(model(x), y))``, so the same loop runs either way.

    trainscale launch --nproc-per-node 2 examples/by_feature/pipeline.py
    trainscale launch --nproc-per-node 2 examples/by_feature/pipeline.py --strategy.schedule gpipe

At 4 processes, ``--strategy.pipeline_stages 2`` makes 2 replicas of a 2-stage pipeline, with DDP between
the replicas of each stage.
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
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per pipeline (each stage sees every sample)")
    p.add_argument("--lr", type=float, default=0.05)
    args, config = p.parse_known_args()  # the rest: --section.field VALUE for the run

    run = trainscale.init(args=["--strategy.pipeline_stages", "2", *config])  # NEW: 2 stages; the command line wins
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)  # built on the whole model
    loader = DataLoader(digits(train=True), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = run.prepare(model, optimizer, loader)  # NEW: this process keeps its stage's layers
    for x, y in run.batches(loader, steps=args.steps):
        run.forward_backward(x, y, nn.functional.cross_entropy)  # NEW: every micro-batch through the stages
        run.step()  # each stage steps its own parameters
    metrics = run.evaluate(digits(train=False))  # the stages gathered: each process evaluates the whole model
    summary = run.finish()
    if run.is_main:
        pipe = summary["pipeline"]  # NEW
        print(f"{pipe['stages']} stages {pipe['chunk_layers']}, {pipe['microbatches']} micro-batches, "
              f"{pipe['schedule']}: bubble {pipe['bubble_measured']:.0%} measured")  # NEW
        print(f"loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}; "
              f"test accuracy {metrics['accuracy']:.3f}")


if __name__ == "__main__":
    main()
