"""Several ``trainscale train`` runs (the Trainer) in one launched job: the process group starts once.

Usage: trainscale launch --nproc-per-node N benchmarks/_pipeline_job.py OUT NAME=--section.field,VALUE,... ...
Each NAME's summary goes to OUT/NAME/run.json; the runs go in the order given (alternate variants there).
"""

import sys
from pathlib import Path

import torch.distributed as dist

from trainscale.config import load_config
from trainscale.distributed.teardown import end_process_group
from trainscale.train.trainer import Trainer

dist.init_process_group("gloo")  # ours: each run leaves it open for the next
out = Path(sys.argv[1])
for case in sys.argv[2:]:
    name, _, args = case.partition("=")
    Trainer(load_config(args.split(",")), json_path=str(out / name / "run.json")).fit()
end_process_group()  # every holder of the group released first (trainscale/distributed/teardown.py)
