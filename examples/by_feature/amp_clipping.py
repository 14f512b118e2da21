"""Mixed precision with gradient clipping: examples/classify_digits.py with ``--strategy.amp`` and
``run.clip_gradients``.

The lines marked ``# NEW`` are the feature; the rest is the base example's loop. The forward runs under
autocast (bf16 on a CPU, fp16 on CUDA, where a dynamic loss scaler keeps small gradients from underflowing).
Clipping a scaled gradient by hand would compare ``max_norm`` with the norm times the scale;
``run.clip_gradients`` unscales first, then clips the whole model's norm, as ``torch.nn.utils.clip_grad_norm_``
on one process would:

    trainscale launch --nproc-per-node 2 examples/by_feature/amp_clipping.py --max-norm 0.3

It prints the gradient norm before clipping and on how many steps clipping engaged. ``--strategy.amp none``
(or ``fp16`` on a GPU) picks the precision; ``trainscale train`` does the same with ``--optim.clip_grad_norm``.
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
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--max-norm", type=float, default=0.3, help="clip the gradient norm to this")  # NEW
    args, config = p.parse_known_args()  # the rest: --section.field VALUE for the run

    amp = "fp16" if torch.cuda.is_available() else "bf16"  # NEW: fp16 autocast needs CUDA; bf16 runs anywhere
    run = trainscale.init(args=["--strategy.amp", amp, *config])  # NEW: the command line's own choice wins
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = DataLoader(digits(train=True), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = run.prepare(model, optimizer, loader)
    norms = []  # NEW
    for x, y in run.batches(loader, steps=args.steps):
        run.backward(nn.functional.cross_entropy(model(x), y))  # the loss is scaled here under fp16
        norm = run.clip_gradients(args.max_norm)  # NEW: after the last backward, before step; norm before clipping
        if norm is not None:  # NEW: None on a micro-batch that does not end an accumulation
            norms.append(norm)  # NEW: kept on the device; read once at the end (no sync per step)
        run.step()  # fp16: skipped when a gradient overflowed, and the scale lowered
    metrics = run.evaluate(digits(train=False))
    summary = run.finish()
    if run.is_main:
        n = torch.stack(norms).float().cpu()  # NEW
        print(f"precision {summary['amp']}: gradient norm before clipping {n[0]:.3f} first, {n.max():.3f} max; "
              f"clipped to {args.max_norm} on {int((n > args.max_norm).sum())} of {len(n)} steps")  # NEW
        print(f"loss {summary['loss_first']:.3f} -> {summary['loss_last']:.3f}; "
              f"test accuracy {metrics['accuracy']:.3f}")


if __name__ == "__main__":
    main()
