"""A user's loop fed by its own batch source: a function (nanoGPT's ``get_batch``) or an ``IterableDataset``.

    trainscale launch --nproc-per-node 2 tests/runapi/source_script.py OUT.pt function|iterable|function-no-steps

Each rank takes its half of a fixed global batch of 8 rows per step (the user's sharding: by ``run.env.rank``),
so 1 and 2 processes train on the same rows and must reach the same weights. Rank 0 saves them.
"""

import sys

import torch
from torch.utils.data import IterableDataset

import trainscale

STEPS, GLOBAL = 5, 8
out, mode = sys.argv[1], sys.argv[2]
g = torch.Generator().manual_seed(0)
X, W = torch.randn(STEPS * GLOBAL, 6, generator=g), torch.randn(6, 1, generator=g)
Y = X @ W + 0.1
run = trainscale.init(args=["--log.progress", "none"])
rank, world = run.env.rank, run.env.world_size
per = GLOBAL // world


def rows(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of step ``step``'s global batch."""
    lo = step * GLOBAL + rank * per
    return X[lo:lo + per], Y[lo:lo + per]


class Stream(IterableDataset):
    def __iter__(self):
        return (rows(s) for s in range(STEPS))


calls = iter(range(10**6))
source = (lambda: rows(next(calls))) if mode.startswith("function") else Stream()
torch.manual_seed(0)
model = torch.nn.Linear(6, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt, batches = run.prepare(model, opt, source)
for x, y in run.batches(batches, steps=None if mode.endswith("no-steps") else STEPS):
    run.backward(torch.nn.functional.mse_loss(model(x), y))
    run.step()
if run.is_main:
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out)
run.finish()
