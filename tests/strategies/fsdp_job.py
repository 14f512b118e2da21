"""Several trainings in one launch (the FSDP tests' budget): each phase a Trainer run on the script's own group.

    trainscale launch --nproc-per-node 2 tests/strategies/fsdp_job.py OUT PHASE[,PHASE...]

Each phase trains the parity job (mlp on digits, clipping, 2 micro-batches per step) and writes its summary to
OUT/PHASE-wW.json and its final checkpoint to OUT/PHASE-wW/last (DCP) or last.pt (one file), W the world size.
Phases: ``ddp`` (a one-file checkpoint every 3 steps); ``fsdp`` (activation checkpointing, a DCP checkpoint every 3
steps); ``fsdp_resumed`` and ``ddp_from_fsdp`` (from the 2-process fsdp's DCP step 3, at this world size);
``fsdp_from_pt`` (from ddp's one-file step 3, writing one file: the shards gathered).
"""

import sys
from pathlib import Path

import torch.distributed as dist

from trainscale.config import load_config
from trainscale.train.trainer import Trainer

STEPS, GLOBAL_BATCH, LR, WIDTH, CLIP = 6, 16, 0.1, 32, 0.5
COMMON = ["--model.name", "mlp", "--model.width", str(WIDTH), "--data.name", "digits", "--job.steps", str(STEPS),
          "--optim.lr", str(LR), "--optim.momentum", "0.9", "--optim.clip_grad_norm", str(CLIP),
          "--data.eval_size", "0", "--log.progress", "none", "--log.skip_first", "1", "--strategy.grad_accum", "2"]
DCP, FILE = ["--checkpoint.format", "dcp"], ["--checkpoint.format", "file"]
FSDP = ["--strategy.fsdp", "true"]
PHASES = {  # name: (overrides, resume from)
    "ddp": ([*FILE, "--checkpoint.every", "3", "--checkpoint.keep", "5"], None),
    "fsdp": ([*DCP, *FSDP, "--strategy.activation_checkpointing", "true", "--checkpoint.every", "3",
              "--checkpoint.keep", "5"], None),
    "fsdp_resumed": ([*DCP, *FSDP], "fsdp-w2/step_3"),
    "ddp_from_fsdp": (DCP, "fsdp-w2/step_3"),
    "fsdp_from_pt": ([*FILE, *FSDP], "ddp-w2/step_3.pt"),
}


def main(out: Path, phases: list[str]) -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo")  # the script owns the group: each Trainer's run leaves it to the next
    for name in phases:
        args, resume = PHASES[name]
        micro = GLOBAL_BATCH // dist.get_world_size() // 2
        tag = f"{name}-w{dist.get_world_size()}"
        cfg = load_config([*COMMON, "--data.batch_size", str(micro), "--checkpoint.dir", str(out / tag), *args])
        Trainer(cfg, resume=str(out / resume) if resume else None, json_path=str(out / f"{tag}.json")).fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split(","))
