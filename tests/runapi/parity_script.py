"""A user's loop on the run API over the parity tests' job (mlp on digits); rank 0 saves the final weights.

    trainscale launch --nproc-per-node 2 tests/runapi/parity_script.py OUT.pt [--no-finish]
"""

import sys

import torch

import trainscale
from trainscale.config import DataConfig
from trainscale.data import build_datasets
from trainscale.models import build_model

out, finish = sys.argv[1], "--no-finish" not in sys.argv
run = trainscale.init(args=["--data.batch_size", "8", "--log.progress", "none"])
train, _, info = build_datasets(DataConfig(name="digits"))
model = build_model("mlp", info.in_shape, info.num_classes, width=32)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, opt, loader = run.prepare(model, opt, train, data_info=info)
for x, y in run.batches(loader, steps=8):
    run.backward(torch.nn.functional.cross_entropy(model(x), y))
    run.step()
run.end_training()  # local SGD's final average, as trainscale train does before its last checkpoint
if run.is_main:
    torch.save(model.state_dict(), out)
if finish:
    run.finish()
