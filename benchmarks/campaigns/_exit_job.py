"""One rank of ``exit_stress.py``'s Python paths (run by ``trainscale launch --nproc-per-node 2``).

    _exit_job.py runapi OUT           a user's loop on the run API, ended by run.finish()
    _exit_job.py runapi-nofinish OUT  the same loop, never calling finish() (the run's exit hook ends it)
    _exit_job.py trainer OUT          Trainer from Python inside the user's own group, then a collective of the
                                      user's and destroy_process_group() (tests/lab/ablate_comm_script.py's pattern)

Everything is tiny: the launches measure how a finished process ends, not training. Rank 0's last line is one
JSON object (the path, and what it checked); the exit status is what the stress harness counts.
"""

from __future__ import annotations

import json
import os
import sys

import torch

# tests/lab/ablate_comm_script.py's job, whose rank 0 aborted at exit in a loaded suite run (issue 32)
ABLATE_JOB = ["--model.name", "resnet18", "--model.width", "4", "--data.name", "synthetic", "--data.image_size", "8",
              "--data.train_size", "256", "--data.eval_size", "16", "--job.steps", "6", "--log.progress", "none",
              "--log.skip_first", "1", "--job.threads", "1"]


def runapi(finish: bool) -> None:
    """A user's own loop: init, prepare, batches, backward, step (and finish)."""
    import trainscale

    run = trainscale.init(args=["--data.batch_size", "8", "--log.progress", "none", "--job.threads", "1"])
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = run.prepare(model, opt, data)
    for x, y in run.batches(loader, steps=3):
        run.backward(torch.nn.functional.cross_entropy(model(x), y))
        run.step()
    if finish:
        run.finish()
    if run.is_main:
        print(json.dumps({"path": "runapi" if finish else "runapi-nofinish", "steps": run.step_count}), flush=True)



if __name__ == "__main__" and sys.argv[1] != "trainer":
    runapi(finish=sys.argv[1] == "runapi")
elif __name__ == "__main__":
    # Trainer.fit() in a group the script made, then the script's own collective and destroy_process_group(), at
    # module level as in the suite's script: its objects live until the interpreter exits, as a user's do.
    import torch.distributed as dist

    from trainscale.config import load_config
    from trainscale.distributed import init_distributed
    from trainscale.train.trainer import Trainer

    cfg = load_config(ABLATE_JOB)
    init_distributed(cfg.job)  # the user's group: the run leaves it open
    t = Trainer(cfg)
    t.fit()
    flat = torch.cat([p.detach().reshape(-1) for p in t.model.parameters()])
    bufs = torch.cat([b.detach().float().reshape(-1) for b in t.model.buffers()])
    both: list = [None] * dist.get_world_size()
    dist.all_gather_object(both, (flat, bufs))
    if dist.get_rank() == 0:
        print(json.dumps({"path": "trainer", "weights_equal": torch.equal(both[0][0], both[1][0]),
                          "world_size": dist.get_world_size(), "pid": os.getpid()}), flush=True)
    dist.destroy_process_group()
