"""The GPT example's loop, small and in fp32, for parity: rank 0 saves the final weights (full tensors).

    TRAINSCALE_ARGS='--strategy.fsdp true' trainscale launch --nproc-per-node 2 tests/runapi/gpt_script.py OUT.pt

The model, the text, the AdamW groups, the hand-set learning rate and the loss are ``examples/gpt.py``'s; the
loop is its own accumulation (``run.no_sync()`` on the first of 2 micro-steps) with ``run.clip_gradients``. The
batches are not shuffled and each process takes GLOBAL / world sequences, so every world size trains on the same
sequences per step: weights at 1 and 2 processes, under DDP or FSDP, must agree.
"""

import contextlib
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader

import trainscale

gpt = SimpleNamespace(**runpy.run_path(str(Path(__file__).parents[2] / "examples" / "gpt.py"), run_name="gpt_example"))

GLOBAL, ACCUM, STEPS, BLOCK, CLIP = 8, 2, 4, 16, 0.5
out = sys.argv[1]
torch.manual_seed(0)
text = gpt.make_text(4000, seed=0)
chars = sorted(set(text))
data = gpt.Windows(torch.tensor([chars.index(c) for c in text]), BLOCK)
model = gpt.GPT(len(chars), BLOCK, layers=2, heads=2, d=32)
init = {k: v.detach().clone() for k, v in model.state_dict().items()}
optimizer = torch.optim.AdamW(gpt.param_groups(model, 0.1), lr=1e-2, betas=(0.9, 0.95))
run = trainscale.init(args=["--log.progress", "none"])
loader = DataLoader(data, batch_size=GLOBAL // run.env.world_size, shuffle=False)
model, optimizer, loader = run.prepare(model, optimizer, loader)
norms = []
for x, y in run.batches(loader, steps=STEPS):
    for group in optimizer.param_groups:
        group["lr"] = gpt.lr_at(run.step_count, STEPS, 1e-2, 2, 1e-3)
    micro = list(zip(x.chunk(ACCUM), y.chunk(ACCUM)))
    for i, (xm, ym) in enumerate(micro):
        with run.no_sync() if i < len(micro) - 1 else contextlib.nullcontext():
            run.backward(gpt.next_token_loss(model(xm), ym) / len(micro))
    norms.append(float(run.clip_gradients(CLIP)))
    run.step()
# Under FSDP each parameter is a DTensor shard: the full tensor is gathered on every rank (a collective).
weights = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
           for k, v in model.state_dict().items()}
if run.is_main:
    torch.save({"weights": weights, "init": init, "norms": norms}, out)
run.finish()
