"""Run by ``trainscale launch``: train with and without --ablate.comm (argv[1]; further argv: more options) and
print whether the ranks' weights agree."""

import sys

import torch
import torch.distributed as dist

from trainscale.config import load_config
from trainscale.distributed import init_distributed
from trainscale.distributed.teardown import end_process_group
from trainscale.train.trainer import Trainer

cfg = load_config(["--model.name", "resnet18", "--model.width", "4", "--data.name", "synthetic",
                   "--data.image_size", "8", "--data.train_size", "256", "--data.eval_size", "16",
                   "--job.steps", "6", "--log.progress", "none", "--log.skip_first", "1", "--job.threads", "1",
                   "--ablate.comm", sys.argv[1], *sys.argv[2:]])
init_distributed(cfg.job)  # our group: the run leaves it open for the comparison below
t = Trainer(cfg)
t.fit()
flat = torch.cat([p.detach().reshape(-1) for p in t.model.parameters()])
bufs = torch.cat([b.detach().float().reshape(-1) for b in t.model.buffers()])
both = [None] * dist.get_world_size()
dist.all_gather_object(both, (flat, bufs))
if dist.get_rank() == 0:
    print(f"WEIGHTS_EQUAL={torch.equal(both[0][0], both[1][0])} BUFFERS_EQUAL={torch.equal(both[0][1], both[1][1])}")
end_process_group()  # our group: ended as every distributed script of the suite ends it
