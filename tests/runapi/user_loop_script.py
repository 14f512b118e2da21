"""A nanoGPT-style user's loop: its own accumulation or the run's, a scheduler, its own reductions; rank 0 saves.

    trainscale launch --nproc-per-node 2 tests/runapi/user_loop_script.py OUT.pt builtin|no_sync

``builtin``: ``--strategy.grad_accum 2`` over batches of 4; ``no_sync``: batches of 8 cut into 2 micro-steps by
the script, ``run.no_sync()`` on the first. Both step a ``torch.optim.lr_scheduler`` when ``run.step()`` returns
True, count DDP's all-reduce calls with a comm hook, and try ``run.all_reduce`` / ``run.mean``.
"""

import contextlib
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

import trainscale

K, STEPS = 2, 6
out, mode = sys.argv[1], sys.argv[2]
args = ["--strategy.grad_accum", str(K), "--data.batch_size", "4"] if mode == "builtin" else ["--data.batch_size", "8"]
run = trainscale.init(args=[*args, "--log.progress", "none", "--data.shuffle", "false"])
g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(96, 6, generator=g), torch.randint(3, (96,), generator=g))
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))  # a different lr at every step
model, opt, loader = run.prepare(model, opt, data)
calls = [0]


def counting_hook(state, bucket):
    calls[0] += 1
    return allreduce_hook(None, bucket)


run.strategy.model.register_comm_hook(None, counting_hook)
lrs = []
for x, y in run.batches(loader, steps=STEPS):
    if mode == "builtin":
        run.backward(torch.nn.functional.cross_entropy(model(x), y))
    else:
        for i, (xm, ym) in enumerate(zip(x.chunk(K), y.chunk(K))):
            with run.no_sync() if i < K - 1 else contextlib.nullcontext():
                run.backward(torch.nn.functional.cross_entropy(model(xm), ym) / K)
    if run.step():
        lrs.append(opt.param_groups[0]["lr"])  # the lr this step used
        sched.step()
rank = float(run.env.rank)
sums = run.all_reduce(torch.tensor([rank + 1.0, 10.0 * rank]))
maxes = run.all_reduce(torch.tensor([rank + 1.0]), "max")
mean_in_place = run.all_reduce(torch.tensor([2.0 * rank]), "mean")
mean = run.mean(torch.tensor(2.0 * rank))
errors = []
for bad in (lambda: run.all_reduce(torch.ones(1), "avg"), lambda: run.all_reduce(torch.ones(1, dtype=torch.long), "mean")):
    try:
        bad()
    except ValueError as e:
        errors.append(str(e))
if mode == "builtin":
    try:
        run.no_sync()
    except ValueError as e:
        errors.append(str(e))
weights = {k: v.clone() for k, v in model.state_dict().items()}
if run.is_main:
    torch.save({"weights": weights, "lrs": lrs, "calls": calls[0], "sums": sums, "maxes": maxes,
                "mean_in_place": mean_in_place, "mean": mean, "errors": errors, "world": dist.get_world_size()}, out)
run.finish()
