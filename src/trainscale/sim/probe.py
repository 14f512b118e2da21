"""One rank of the calibration probe, started by ``trainscale launch`` (torchrun): the backend's
all-reduce time and CPU cost at several sizes, and the share of a core each of P busy ranks gets.

Run by ``trainscale plan calibrate``; by hand::

    trainscale launch --nproc-per-node 2 -m trainscale.sim.probe --out ar2.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

__all__ = ["main"]


def _agreed_reps(seconds_per_rep: float, budget_s: float) -> int:
    """Repeats that fit ``budget_s``, the same on every rank (MAX): every rank must run the same collectives."""
    reps = torch.tensor([min(200, max(5, int(budget_s / max(seconds_per_rep, 1e-6))))])
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)
    return int(reps.item())


def _time_allreduce(nbytes: int, budget_s: float) -> tuple[float, float, float]:
    """(blocking seconds, queued seconds, CPU seconds) per all-reduce of ``nbytes`` (float32).

    Blocking: the median of single calls started together after a barrier. Queued: a burst of asynchronous
    calls on separate tensors, waited at the end, as DDP issues its buckets during backward (kept for the
    record: on a time-shared host it was not cheaper per call, docs/plan.md). CPU: this process's CPU seconds
    (all threads, Gloo's included) per queued call: on a CPU host that work competes with compute.
    """
    t = torch.ones(max(1, nbytes // 4))
    t0 = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(t)
    reps = _agreed_reps((time.perf_counter() - t0) / 3, budget_s / 2)
    times: list[float] = []
    for _ in range(reps):
        dist.barrier()  # start together: the time is the collective's, not a late rank's
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    bufs = [torch.ones_like(t) for _ in range(reps)]
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for w in [dist.all_reduce(b, async_op=True) for b in bufs]:
        w.wait()
    queued, cpu = (time.perf_counter() - t0) / reps, (time.process_time() - c0) / reps
    return statistics.median(times), queued, cpu


def _spin_share(seconds: float) -> float:
    """Share of a core this rank's one busy thread gets while every rank spins at once (host load now)."""
    dist.barrier()
    t0, c0, x = time.perf_counter(), time.process_time(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(1000):
            x += 1
    return (time.process_time() - c0) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="trainscale.sim.probe")
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", default="4096,65536,1048576,4194304")
    p.add_argument("--budget", type=float, default=0.4, help="seconds of repeats per size")
    p.add_argument("--spin", type=float, default=1.0, help="seconds of the CPU-share measurement")
    a = p.parse_args(argv)
    import datetime

    # A stuck rank fails the probe within two minutes instead of hanging the calibration.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {"world_size": world, "threads": torch.get_num_threads(), "allreduce": [], "allreduce_queued": [],
                 "allreduce_cpu": []}
    for n in (int(s) for s in a.sizes.split(",")):
        blocking, queued, cpu = _time_allreduce(n, a.budget)
        cpus = [None] * world
        dist.all_gather_object(cpus, cpu)
        out["allreduce"].append([n, blocking])
        out["allreduce_queued"].append([n, queued])
        out["allreduce_cpu"].append([n, statistics.median(cpus)])
    # Every rank's CPU share while all P spin: the host's sharing right now, other programs included.
    shares = [None] * world
    dist.all_gather_object(shares, _spin_share(a.spin))
    out["share"] = statistics.median(shares)
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
