"""An untuned plain DDP script, as a user writes it: two conv layers and a linear head, Adam, batch 32.

No trainscale import and no tuning: DDP's defaults unless ``--bucket-cap-mb`` is given, a DataLoader
without workers, synthetic tensors. Run it under torchrun:

    torchrun --nproc-per-node 2 untuned_conv.py --steps 40
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class ConvNet(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.head = nn.Linear(channels * 8 * 8, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--bucket-cap-mb", type=float, default=None)
    args = p.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = ConvNet(args.channels)
    kwargs = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
    ddp_model = DDP(model, **kwargs)
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(2048, 3, 16, 16, generator=g), torch.randint(0, 10, (2048,), generator=g))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step == args.steps:
                break
        epoch += 1
    if dist.get_rank() == 0:
        print(f"done: {step} steps, loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
