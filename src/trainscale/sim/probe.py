"""One rank of the calibration probe, started by ``trainscale launch`` (torchrun): the backend's
all-reduce time at several sizes, and how much P concurrent ranks slow the job's own forward+backward.

Run by ``trainscale plan calibrate``; by hand::

    trainscale launch --nproc-per-node 2 -m trainscale.sim.probe --out ar2.json --train-args '["--model","mlp"]'
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

__all__ = ["main"]


def _time_allreduce(nbytes: int, budget_s: float) -> float:
    """Median seconds of one all-reduce of ``nbytes`` (float32), over repeats within about ``budget_s``."""
    t = torch.ones(max(1, nbytes // 4))
    t0 = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(t)
    # Every rank must run the same number of collectives: the count is agreed on (MAX), never per-rank clocks.
    reps = torch.tensor([min(200, max(5, int(budget_s / max((time.perf_counter() - t0) / 3, 1e-6))))])
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)
    times: list[float] = []
    for _ in range(int(reps.item())):
        dist.barrier()  # start together: the time is the collective's, not a late rank's
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _compute_step(train_args: list[str]):
    """The job's forward + backward on one fixed batch, as a callable (no data loading, no optimizer)."""
    from ..data import build_datasets
    from ..models import build_model
    from ..train.cli import parse

    _, cfg = parse(train_args)
    train, _, info = build_datasets(cfg.data)
    model = build_model(cfg.model.name, info.in_shape, info.num_classes, cfg.model.width, cfg.model.depth)
    x = torch.randn(cfg.data.batch_size, *info.in_shape)
    y = torch.randint(0, info.num_classes, (cfg.data.batch_size,))

    def step() -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        model.zero_grad(set_to_none=True)

    return step


def _time_compute(step, reps: int) -> float:
    """Mean seconds of ``step`` over ``reps`` runs: with ranks time-sliced on shared cores a mean, not a median,
    is what a step costs."""
    step()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    return (time.perf_counter() - t0) / reps


def _lockstep(step, reps: int) -> float:
    """Mean seconds of barrier + ``step`` + barrier on every rank: the synchronised step's slowest rank."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
        dist.barrier()
    return (time.perf_counter() - t0) / reps


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="trainscale.sim.probe")
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", default="4096,65536,1048576,4194304")
    p.add_argument("--budget", type=float, default=0.4, help="seconds of repeats per size")
    p.add_argument("--train-args", default="", help="JSON list of train options: time their compute alone and together")
    p.add_argument("--reps", type=int, default=5, help="fewest compute repeats")
    p.add_argument("--compute-budget", type=float, default=0.6, help="seconds of compute repeats per measurement")
    a = p.parse_args(argv)
    import datetime

    # A stuck rank fails the probe within two minutes instead of hanging the calibration.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {"world_size": world, "threads": torch.get_num_threads(), "allreduce": []}
    for n in (int(s) for s in a.sizes.split(",")):
        out["allreduce"].append([n, _time_allreduce(n, a.budget)])
    if a.train_args:
        step = _compute_step(json.loads(a.train_args))
        once = _time_compute(step, 2)
        reps = torch.tensor([min(200, max(a.reps, int(a.compute_budget / max(once, 1e-6))))])
        dist.all_reduce(reps, op=dist.ReduceOp.MAX)  # the same count everywhere, so all ranks overlap throughout
        alone = 0.0
        for r in range(world):  # one rank at a time: the compute without neighbours
            dist.barrier()
            if r == rank:
                alone = _time_compute(step, int(reps.item()))
            dist.barrier()
        # All ranks at once, in lock-step as DDP's steps are: barrier, compute, barrier. On shared cores the
        # step lasts as long as its slowest rank, time slices included; the empty lock-step is subtracted.
        n = int(reps.item())
        lockstep = _lockstep(step, n) - _lockstep(lambda: None, n)
        dist.barrier()
        together = _time_compute(step, n)  # free-running: each rank's fair share of the cores
        vals = [None] * world
        dist.all_gather_object(vals, (alone, together, lockstep))
        out["compute_alone_s"] = statistics.median(v[0] for v in vals)
        out["compute_together_s"] = statistics.median(v[1] for v in vals)
        out["compute_lockstep_s"] = statistics.median(v[2] for v in vals)
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
