"""A user's loop that clips gradients, through the run API or by hand; rank 0 saves the final weights.

    trainscale launch --nproc-per-node 2 tests/runapi/clip_script.py OUT.pt run|manual|none

``run``: ``run.clip_gradients``; ``manual``: ``torch.nn.utils.clip_grad_norm_`` on the model's parameters after
the last micro-batch's backward (what a user writes under plain DDP); ``none``: no clipping. The largest
norm seen goes into OUT.pt too, so a test can check that clipping engaged.
"""

import sys

import torch

import trainscale
from trainscale.config import DataConfig
from trainscale.data import build_datasets
from trainscale.models import build_model

MAX_NORM = 0.05  # well under the first steps' norms (about 0.3-1 on this job), so every step clips
out, mode = sys.argv[1], sys.argv[2]
run = trainscale.init(args=["--data.batch_size", "8", "--log.progress", "none"])
train, _, info = build_datasets(DataConfig(name="digits"))
model = build_model("mlp", info.in_shape, info.num_classes, width=32)
opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
model, opt, loader = run.prepare(model, opt, train, data_info=info)
accum, micro, norms = run.cfg.strategy.grad_accum, 0, [0.0]
for x, y in run.batches(loader, steps=6):
    run.backward(torch.nn.functional.cross_entropy(model(x), y))
    micro += 1
    if mode == "run":
        norm = run.clip_gradients(MAX_NORM)
        norms += [] if norm is None else [float(norm)]
    elif mode == "manual" and micro % accum == 0:
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
    run.step()
if run.is_main:
    torch.save({"weights": model.state_dict(), "max_norm_seen": max(norms)}, out)
run.finish()
