"""A Lightning ``Trainer`` script, as Lightning's docs teach it (run it under torchrun).

No trainscale import. Fault switches for trainscale's tests: ``--slow-collate-ms 20`` (a Python collate,
no workers), ``--slow-rank 1`` (that rank's forward 3x slower). ``--eval-every N`` validates every N batches
(``--eval-collate-ms`` slows the validation loader).

    torchrun --nproc-per-node 2 lightning_train.py --steps 40
"""

import argparse
import os
import time

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate


class LitNet(L.LightningModule):
    def __init__(self, width, slow_rank):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                  nn.Linear(width, 10))
        self.slow_rank = slow_rank
        self.loss_fn = nn.CrossEntropyLoss()

    def forward(self, x):
        t = time.perf_counter()
        out = self.body(x)
        if self.global_rank == self.slow_rank:
            time.sleep((time.perf_counter() - t) * 2)
        return out

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.loss_fn(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return self.loss_fn(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--slow-collate-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--devices", type=int, default=0, help="hard-coded, as many scripts do (0: torchrun's count)")
    p.add_argument("--accum", type=int, default=1, help="accumulate_grad_batches (Lightning skips the exchange "
                                                        "on all but the last micro-batch)")
    p.add_argument("--eval-every", type=int, default=0, help="val_check_interval: validate every N batches")
    p.add_argument("--eval-collate-ms", type=float, default=0.0, help="the validation loader's collate sleeps this")
    args = p.parse_args()

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g))

    def collate(samples):
        time.sleep(args.slow_collate_ms / 1000)
        return default_collate(samples)

    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True,
                        collate_fn=collate if args.slow_collate_ms else None)
    devices = args.devices or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's process count on this node
    def eval_collate(samples):
        time.sleep(args.eval_collate_ms / 1000)
        return default_collate(samples)

    held_out = DataLoader(TensorDataset(torch.randn(256, 64, generator=g), torch.randint(0, 10, (256,), generator=g)),
                          batch_size=64, collate_fn=eval_collate) if args.eval_every else None
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                        max_steps=args.steps, accumulate_grad_batches=args.accum, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        val_check_interval=args.eval_every or None, check_val_every_n_epoch=None if args.eval_every
                        else 1, num_sanity_val_steps=0)
    trainer.fit(LitNet(args.width, args.slow_rank), loader, held_out)


if __name__ == "__main__":
    main()
