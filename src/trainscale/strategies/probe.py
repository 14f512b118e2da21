"""One rank of the calibration probe, started by ``trainscale launch`` (torchrun): the backend's
all-reduce time and CPU cost at several sizes, the share of a core each of P busy ranks gets, and (given the
job's CPU demand and buckets) the step of a skeleton of the job: its CPU spun, its buckets all-reduced. With
``--hierarchical`` on several nodes, the same again with the all-reduce that ``strategy.hierarchical`` runs (the
DDP hook itself over the launcher's nodes).

It lives with the strategies, not with the planner that reads its output: it runs the strategies' own exchanges
(the hierarchical DDP hook), and the strategies already build on the planner's cost formulas.

Run by ``trainscale plan calibrate``; by hand::

    trainscale launch --nproc-per-node 2 -m trainscale.strategies.probe --out ar2.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Protocol, cast

import torch
import torch.distributed as dist

__all__ = ["main"]


class _Waitable(Protocol):
    def wait(self) -> object: ...


# One gradient bucket's exchange, started: (tensor, bucket index) -> something to wait for.
Exchange = Callable[[torch.Tensor, int], _Waitable]


def _flat(t: torch.Tensor, _index: int) -> _Waitable:
    """Gloo's all-reduce over every rank, as DDP runs it without a hook."""
    return dist.all_reduce(t, async_op=True)


class _Bucket:
    """What ``hierarchical_hook`` reads of DDP's ``GradBucket``: the flat gradient tensor and its index."""

    __slots__ = ("_buf", "_index")

    def __init__(self, buf: torch.Tensor, index: int):
        self._buf, self._index = buf, index

    def buffer(self) -> torch.Tensor:
        return self._buf

    def index(self) -> int:
        return self._index


def _hierarchical(threads: int) -> tuple[Exchange, list[list[int]]] | None:
    """The product's hierarchical all-reduce over the launcher's nodes (a collective), and the nodes' ranks;
    None where it has one level only (one node, or one process per node)."""
    from ..distributed.env import DistEnv, node_members
    from ..strategies.comm import CommMeter
    from ..strategies.hooks import HierState, hierarchical_hook, node_groups

    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    # The node of each rank as the trainer reads it (distributed/env.py: GROUP_RANK, set by torchrun).
    env = DistEnv(rank, world, int(os.environ.get("LOCAL_RANK", 0)), local,
                  int(os.environ.get("GROUP_RANK", rank // max(1, local))), max(1, world // max(1, local)),
                  torch.device("cpu"), "gloo", "-", threads)
    members = node_members(env)
    if len(members) < 2 or len({len(m) for m in members}) > 1 or len(members[0]) < 2:
        return None
    # The trainer's own groups and hook (strategies/hooks.py, comm_groups 1): the same three collectives per
    # bucket, chained on Gloo through the hook's waiter thread, so what is timed is what the job runs.
    state = HierState([node_groups(world, len(members[0]), members)], world, CommMeter())

    def exchange(t: torch.Tensor, index: int) -> _Waitable:
        return hierarchical_hook(state, cast(dist.GradBucket, _Bucket(t, index)))

    return exchange, members


def _agreed_reps(seconds_per_rep: float, budget_s: float) -> int:
    """Repeats that fit ``budget_s``, the same on every rank (MAX): every rank must run the same collectives."""
    reps = torch.tensor([min(200, max(5, int(budget_s / max(seconds_per_rep, 1e-6))))])
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)
    return int(reps.item())


def _time_allreduce(nbytes: int, budget_s: float, exchange: Exchange = _flat) -> tuple[float, float, float]:
    """(blocking seconds, queued seconds, CPU seconds) per all-reduce of ``nbytes`` (float32) by ``exchange``.

    Blocking: the median of single calls started together after a barrier. Queued: a burst of asynchronous
    calls on separate tensors, waited at the end, as DDP issues its buckets during backward (kept for the
    record: on a time-shared host it was not cheaper per call, benchmarks/results/2026-11-24-plan-accuracy.md). CPU: this process's CPU seconds
    (all threads, Gloo's included) per queued call: on a CPU host that work competes with compute.
    """
    t = torch.ones(max(1, nbytes // 4))
    t0 = time.perf_counter()
    for _ in range(3):
        exchange(t, 0).wait()
    reps = _agreed_reps((time.perf_counter() - t0) / 3, budget_s / 2)
    times: list[float] = []
    for _ in range(reps):
        dist.barrier()  # start together: the time is the collective's, not a late rank's
        t0 = time.perf_counter()
        exchange(t, 0).wait()
        times.append(time.perf_counter() - t0)
    bufs = [torch.ones_like(t) for _ in range(reps)]
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for w in [exchange(b, i) for i, b in enumerate(bufs)]:
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


def _skeleton(sk: dict, steps: int, budget_s: float, exchange: Exchange = _flat) -> tuple[list[float], float]:
    """Wall seconds of each step of the job's skeleton on this rank, step end to step end, after four warm-up steps,
    and this process's CPU seconds per step over them (all threads: the spin and Gloo's, as the job's step pays it).

    ``sk``: ``cpu_s`` (this thread's CPU seconds of forward + backward), ``rest_cpu_s`` (optimizer and loop,
    after the exchange), ``backward_share``, ``buckets`` (bytes, in backward order), ``ready`` (each bucket's
    ready point as a share of backward), ``buffer_bytes`` (broadcast from rank 0 every forward); ``exchange``
    starts a bucket's all-reduce (flat or the hierarchical hook). The CPU is
    spun with small matmuls until this thread has used it, so a rank that the host deschedules takes longer,
    as the job's rank would; the buckets are queued as backward reaches them and waited at its end, as DDP does.
    On a time-shared host this is what the free-spin share misses: ranks blocked in a collective give their
    core away, and a late rank keeps the others waiting.
    """
    a = torch.rand(128, 128) if torch.get_num_threads() == 1 else torch.rand(384, 384)
    grads = [torch.zeros(max(1, int(b) // 4)) for b in sk["buckets"]]
    buffer_bytes = int(sk.get("buffer_bytes") or 0)
    buf = torch.zeros(max(1, buffer_bytes // 4)) if buffer_bytes else None
    fwd = sk["cpu_s"] * (1 - sk["backward_share"])
    bwd = sk["cpu_s"] * sk["backward_share"]

    def spin(until: float) -> None:
        while time.thread_time() < until:
            a @ a

    def one_step() -> None:
        c0 = time.thread_time()
        if buf is not None:
            dist.broadcast(buf, 0)
        spin(c0 + fwd)
        works = []
        for i, (g, r) in enumerate(zip(grads, sk["ready"])):
            spin(c0 + fwd + r * bwd)
            works.append(exchange(g, i))
        spin(c0 + fwd + bwd)
        for w in works:
            w.wait()
        spin(c0 + fwd + bwd + sk.get("rest_cpu_s", 0.0))

    # Every rank must run the same steps, with no collective of the probe's own between them (one would line the
    # ranks up each step, which the job's loop does not): a few warm-up steps agree on how many fit the budget.
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(4):
        one_step()
    n = _agreed_reps((time.perf_counter() - t0) / 4, budget_s)
    n = max(8, min(steps, n))
    ends, c0 = [time.perf_counter()], time.process_time()
    for _ in range(n):
        one_step()
        ends.append(time.perf_counter())
    # Step to step, as the job's loop times it: a rank's wait for a late peer is in its step.
    return [b - a for a, b in zip(ends, ends[1:])], (time.process_time() - c0) / n


def _sizes(sizes: list[int], budget_s: float, exchange: Exchange = _flat) -> dict[str, list[list[float]]]:
    """Per size: blocking and queued seconds, and the median rank's CPU seconds, of one ``exchange``."""
    world = dist.get_world_size()
    out: dict[str, list[list[float]]] = {"allreduce": [], "allreduce_queued": [], "allreduce_cpu": []}
    for n in sizes:
        blocking, queued, cpu = _time_allreduce(n, budget_s, exchange)
        cpus: list[float] = [0.0] * world  # all_gather_object fills every entry
        dist.all_gather_object(cpus, cpu)
        out["allreduce"].append([n, blocking])
        out["allreduce_queued"].append([n, queued])
        out["allreduce_cpu"].append([n, statistics.median(cpus)])
    return out


def _skeleton_step(sk: dict, steps: int, budget_s: float, exchange: Exchange = _flat) -> dict:
    """The skeleton's step on every rank; the job's is its slowest rank's median (synchronised ranks)."""
    times, cpu = _skeleton(sk, steps, budget_s, exchange)
    medians: list[float] = [0.0] * dist.get_world_size()  # all_gather_object fills every entry
    dist.all_gather_object(medians, statistics.median(times))
    cpus: list[float] = [0.0] * dist.get_world_size()
    dist.all_gather_object(cpus, cpu)
    return {"step_s": max(medians), "rank_step_s": medians, "steps": len(times), "rank_cpu_s": cpus}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="trainscale.strategies.probe")
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", default="4096,65536,1048576,4194304")
    p.add_argument("--budget", type=float, default=0.4, help="seconds of repeats per size")
    p.add_argument("--spin", type=float, default=1.0, help="seconds of the CPU-share measurement")
    p.add_argument("--skeleton", default="", help="JSON of the job's skeleton (see _skeleton); empty: none")
    p.add_argument("--skeleton-steps", type=int, default=200, help="most skeleton steps measured (the budget may allow fewer)")
    p.add_argument("--skeleton-budget", type=float, default=4.0, help="seconds of skeleton steps (at least 8 steps are run)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads per rank (0: torch's default)")
    p.add_argument("--hierarchical", action="store_true",
                   help="on several nodes of 2 or more processes, also the hierarchical all-reduce (the DDP hook "
                        "of strategy.hierarchical) at the same sizes, and the skeleton with it")
    a = p.parse_args(argv)
    import datetime

    # A stuck rank fails the probe within two minutes instead of hanging the calibration.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.threads:
        torch.set_num_threads(a.threads)
    sizes = [int(s) for s in a.sizes.split(",")]
    sk = json.loads(a.skeleton) if a.skeleton else None
    out: dict = {"world_size": world, "threads": torch.get_num_threads(), **_sizes(sizes, a.budget)}
    # Every rank's CPU share while all P spin: the host's sharing right now, other programs included.
    shares: list[float] = [0.0] * world  # all_gather_object fills every entry
    dist.all_gather_object(shares, _spin_share(a.spin))
    out["share"] = statistics.median(shares)
    if sk:
        out["skeleton"] = _skeleton_step(sk, a.skeleton_steps, a.skeleton_budget)
    hier = _hierarchical(torch.get_num_threads()) if a.hierarchical else None
    if hier is not None:
        exchange, members = hier
        out["hierarchical"] = {"nodes": members, **_sizes(sizes, a.budget, exchange)}
        if sk:
            out["hierarchical"]["skeleton"] = _skeleton_step(sk, a.skeleton_steps, a.skeleton_budget, exchange)
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
