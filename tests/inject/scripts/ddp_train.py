"""A plain DDP training script, as a user writes it after PyTorch's DDP tutorial (run it under torchrun).

No trainscale import: the doctor reaches it from outside. The switches after ``--steps`` plant faults for
trainscale's tests: ``--slow-collate-ms 20`` (a Python collate that takes 20 ms a batch, no workers),
``--slow-rank 1`` (that rank's forward 3x slower), ``--find-unused`` (DDP walks the graph every step),
``--accum 4`` (gradients accumulated over 4 micro-batches, as a first try does: each one exchanged), with
``--no-sync`` (the fix: ``ddp_model.no_sync()`` on all but the last), ``--pin-cpu`` (the process pinned to one
core, as some packages do at import: pytorch#82219), ``--compile`` (``torch.compile`` of the DDP model, as
PyTorch's DDP + compile notes do), ``--fsdp`` (FSDP2's ``fully_shard`` on each layer and the model, no DDP),
``--eval-every N`` (a pass over a held-out loader every N steps, under ``torch.no_grad``, as scripts evaluate;
``--eval-collate-ms`` slows its loader, ``--eval-reads-with-grad`` takes its batches outside ``no_grad``),
``--teacher`` (a frozen DDP copy distilled from, its forward under ``no_grad`` inside each step).
``--device cuda`` trains on the GPUs as the tutorial does (rank % GPU count, so ranks may share one; Gloo).

    torchrun --nproc-per-node 2 ddp_train.py --steps 40
"""

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch.utils.data.dataloader import default_collate


class ToyModel(nn.Module):
    def __init__(self, width, slow=1.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, 10))
        self.slow = slow

    def forward(self, x):
        t = time.perf_counter()
        out = self.net(x)
        if self.slow > 1:
            time.sleep((time.perf_counter() - t) * (self.slow - 1))
        return out


def slow_collate(ms):
    def collate(samples):
        time.sleep(ms / 1000)
        return default_collate(samples)
    return collate


def evaluate(model, loader, device, rank, step, reads_with_grad=False):
    """Accuracy over a held-out loader, every batch of it, without gradients (only the forward's, when
    ``reads_with_grad``)."""
    model.eval()
    right = seen = 0
    with contextlib.nullcontext() if reads_with_grad else torch.no_grad():
        for x, y in loader:
            with torch.no_grad():
                right += int((model(x.to(device)).argmax(1) == y.to(device)).sum())
            seen += len(y)
    model.train()
    if rank == 0:
        print(f"eval at step {step}: {seen} samples, accuracy {right / seen:.3f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--slow-collate-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--find-unused", action="store_true")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--no-sync", action="store_true", help="exchange on the last micro-batch only")
    p.add_argument("--pin-cpu", action="store_true", help="pin this process to its first allowed core")
    p.add_argument("--compile", action="store_true", help="torch.compile the DDP model")
    p.add_argument("--fsdp", action="store_true", help="shard the model with fully_shard (FSDP2) instead of DDP")
    p.add_argument("--eval-every", type=int, default=0, help="every N steps, a pass over a held-out loader")
    p.add_argument("--eval-collate-ms", type=float, default=0.0, help="the held-out loader's collate sleeps this")
    p.add_argument("--eval-reads-with-grad", action="store_true",
                   help="the pass takes its batches outside no_grad (as the Hugging Face Trainer's loop does)")
    p.add_argument("--teacher", action="store_true",
                   help="distil from a frozen DDP copy, its forward under no_grad inside each step")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--save", default="")
    p.add_argument("--save-each", default="", help="every rank saves its replica to PATH.rankN (tests)")
    args = p.parse_args()
    if args.pin_cpu:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    device = torch.device("cuda", rank % torch.cuda.device_count()) if args.device == "cuda" else torch.device("cpu")
    model = ToyModel(args.width, 3.0 if rank == args.slow_rank else 1.0).to(device)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model.net:
            if any(True for _ in layer.parameters()):
                fully_shard(layer)
        ddp_model = fully_shard(model)
    else:
        ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                        find_unused_parameters=args.find_unused)
    if args.compile:
        ddp_model = torch.compile(ddp_model)
    teacher = DDP(ToyModel(args.width).to(device).eval()) if args.teacher else None
    loss_fn = nn.CrossEntropyLoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    collate = slow_collate(args.slow_collate_ms) if args.slow_collate_ms else None
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, collate_fn=collate)
    held_out = DataLoader(TensorDataset(torch.randn(256, 64, generator=g), torch.randint(0, 10, (256,), generator=g)),
                          batch_size=128, collate_fn=slow_collate(args.eval_collate_ms) if args.eval_collate_ms else None)

    step, epoch, t_warm = 0, 0, 0.0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            if i % args.accum == 0:
                optimizer.zero_grad()
            last = (i + 1) % args.accum == 0
            with ddp_model.no_sync() if args.no_sync and not last else contextlib.nullcontext():
                out = ddp_model(x)
                loss = loss_fn(out, y)
                if teacher is not None:
                    with torch.no_grad():
                        soft = teacher(x).softmax(1)
                    loss = loss + 0.1 * nn.functional.cross_entropy(out, soft)
                (loss / args.accum if args.accum > 1 else loss).backward()
            if not last:
                continue
            optimizer.step()
            step += 1
            if step == 5:
                t_warm = time.perf_counter()
            if args.eval_every and step % args.eval_every == 0:
                evaluate(ddp_model, held_out, device, rank, step, args.eval_reads_with_grad)
            if step == args.steps:
                break
        epoch += 1
    if args.save_each:
        torch.save(model.state_dict(), f"{args.save_each}.rank{rank}")
    if rank == 0:
        ms = (time.perf_counter() - t_warm) * 1e3 / max(1, step - 5)
        print(f"done: {step} steps, loss {loss.item():.4f}, {ms:.3f} ms/step after the first 5")
        if args.save:
            torch.save(model.state_dict(), args.save)
    dist.barrier()  # no rank tears Gloo down while a peer is still in its last exchange (seen: SIGABRT at exit)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
