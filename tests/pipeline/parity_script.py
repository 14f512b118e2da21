"""Several pipelined runs of ``trainscale train``'s Trainer in one launched job (one process-group start-up).

Usage: trainscale launch --nproc-per-node 4 parity_script.py OUT_DIR NAME=ARGS ...  (ARGS comma-separated)
"""

import sys
from pathlib import Path

import torch.distributed as dist

from pipeline_common import COMMON, GLOBAL_BATCH, STEPS
from trainscale.config import load_config
from trainscale.train.trainer import Trainer

dist.init_process_group("gloo")  # ours: each run leaves it open for the next
out = Path(sys.argv[1])
for case in sys.argv[2:]:
    name, _, args = case.partition("=")
    extra = args.split(",")
    stages = int(extra[extra.index("--strategy.pipeline_stages") + 1])
    replicas = dist.get_world_size() // stages
    cfg = load_config([*COMMON, "--job.steps", str(STEPS), "--data.batch_size", str(GLOBAL_BATCH // replicas),
                       "--checkpoint.dir", str(out / name), *extra])
    Trainer(cfg, json_path=str(out / name / "run.json")).fit()
dist.destroy_process_group()
