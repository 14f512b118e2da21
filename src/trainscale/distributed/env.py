"""Process-group set-up: read torchrun's environment, choose device and backend, set threads."""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..about import available_cores
from ..config import ConfigError, JobConfig
from .hangs import enable_flight_recorder, record_fatal_stacks

__all__ = ["DistEnv", "init_distributed", "resolve_device", "resolve_backend", "default_threads",
           "gather_env_rows", "is_launched", "shutdown", "node_members", "cluster_fields"]


@dataclass
class DistEnv:
    """Where this process stands in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nnodes: int
    device: torch.device
    backend: str
    master: str
    threads: int
    cluster: str = "single (no launcher or scheduler variables)"  # the resolver's source and why (env table)
    cluster_source: str = "single"  # ray | torchrun | slurm | kubeflow | pytorchjob | single

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the one that logs, writes files and prints tables."""
        return self.rank == 0


def is_launched() -> bool:
    """True when torchrun (or ``trainscale launch``) started this process as one rank of a job."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def default_threads(local_processes: int) -> int:
    """This machine's cores shared among the processes on it (at least 1 each)."""
    return max(1, available_cores() // max(1, local_processes))


def resolve_device(choice: str, local_rank: int = 0) -> torch.device:
    """``auto`` → ``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("job.device", choice, "CUDA is not available on this machine; use cpu or auto")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def resolve_backend(choice: str, device: torch.device, local_processes: int = 1, gpus: int | None = None) -> str:
    """``auto`` → NCCL when each local process has a GPU of its own, Gloo otherwise.

    NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so processes that share GPUs
    (``--nproc 2`` on a one-GPU machine) exchange their CUDA tensors through Gloo instead.
    """
    if device.type == "cuda" and gpus is None:
        gpus = torch.cuda.device_count()
    shared = device.type == "cuda" and local_processes > (gpus or 0)
    if choice == "auto":
        return "nccl" if device.type == "cuda" and not shared else "gloo"
    if choice == "nccl" and device.type != "cuda":
        raise ConfigError("job.backend", choice, "nccl needs CUDA devices; use gloo or auto on CPU")
    if choice == "nccl" and shared:
        raise ConfigError("job.backend", choice, f"nccl needs one GPU per process ({local_processes} processes "
                          f"on this machine, {gpus} GPU(s)); use gloo or auto, which picks gloo here")
    return choice


def init_distributed(job: JobConfig) -> DistEnv:
    """Join the job's process group (or make a one-rank group when not launched) and pin the device.

    Where the process stands comes from ``cluster.resolve``: torchrun's variables, else a scheduler's (an srun
    task, a Kubeflow or PyTorchJob pod), exported as torchrun would set them, so every later reader agrees.
    """
    from .cluster import resolve

    cluster = resolve(role="rank")
    if cluster.source != "torchrun" and not dist.is_initialized():
        os.environ.update(cluster.rank_env())
    launched = is_launched()
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    device = resolve_device(job.device, local_rank)
    # A group made before init (Ray Train's) keeps its backend: the table and the strategies must say what runs.
    made = dist.get_backend() if dist.is_initialized() else None
    backend = made if made in ("gloo", "nccl") else resolve_backend(job.backend, device, local_world)
    threads = job.threads or int(os.environ.get("OMP_NUM_THREADS", 0)) or default_threads(local_world)
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # Fixed input shapes are the rule in training: let cuDNN pick its fastest convolution once.
        torch.backends.cudnn.benchmark = True
    from .watchdog import backstop_timeout_s
    # The watchdog names a hung rank at job.timeout_s; PyTorch's collective timeout is its backstop.
    timeout = datetime.timedelta(seconds=backstop_timeout_s(job.timeout_s, job.heartbeat_s))
    from .teardown import install_exit_guard
    install_exit_guard()  # whatever the caller does not end is ended before the interpreter finalizes
    if not dist.is_initialized():
        if launched:
            enable_flight_recorder()  # the hang report names each rank's collective
            record_fatal_stacks()  # and the launcher names where a rank that Gloo aborted stood
            dist.init_process_group(backend, timeout=timeout, device_id=device if backend == "nccl" else None,
                                    **_attempt_store(rank, world, timeout))
            _agree_attempt(device if backend == "nccl" else torch.device("cpu"))
        else:
            # A one-rank group keeps one code path (DDP included) for 1 and N processes.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    if cluster.source == "ray" and dist.is_initialized():
        os.environ.update(_ray_nodes(cluster.node_rank, device if backend == "nccl" else torch.device("cpu")))
    master = f"{os.environ.get('MASTER_ADDR', 'localhost')}:{os.environ.get('MASTER_PORT', '-')}" if launched else "-"
    nnodes = int(os.environ.get("GROUP_WORLD_SIZE", 0)) or max(1, world // max(1, local_world))
    return DistEnv(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                   node_rank=int(os.environ.get("GROUP_RANK", rank // max(1, local_world))), nnodes=nnodes,
                   device=device, backend=backend, master=master, threads=threads, cluster=cluster.describe(),
                   cluster_source=cluster.source)


def _ray_nodes(node_rank: int, device: torch.device) -> dict[str, str]:
    """torchrun's GROUP_RANK and GROUP_WORLD_SIZE for a Ray Train worker (a collective, once at init).

    Ray Train sets NODE_RANK (dense, from 0) but not the node count, and may place unequal worker counts per
    node, so world // local world can be wrong: the highest node rank over all ranks is exact.
    """
    top = torch.tensor([node_rank], device=device)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    return {"GROUP_RANK": str(node_rank), "GROUP_WORLD_SIZE": str(int(top.item()) + 1)}  # sync point: once


def _attempt_store(rank: int, world: int, timeout: datetime.timedelta) -> dict:
    """Under torchrun's agent store, a store view of this restart attempt's own (empty: init's env:// default).

    torch 2.13's restarted Gloo group otherwise reads the previous attempt's addresses from the agent's store
    and fails ("connectFullMesh ... Connection refused"); a key prefix per attempt keeps the attempts apart.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_PORT" not in os.environ:
        return {}
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    base = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"]), world,
                         is_master=False, timeout=timeout)
    return {"store": dist.PrefixStore(f"trainscale/attempt_{attempt}", base), "rank": rank, "world_size": world}


def _agree_attempt(device: torch.device) -> None:
    """Every rank takes the job's highest restart count as its own (a collective, once per attempt).

    torchrun counts restarts per agent: a node's launcher that was brought back after its node died starts
    again at 0 while the survivors' agents count 1. The run's resume decision, its watchdog and store keys
    and the summary's ``restarts`` read ``TORCHELASTIC_RESTART_COUNT``, so they must all see one number.
    """
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return
    count = torch.tensor([int(os.environ["TORCHELASTIC_RESTART_COUNT"])], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(int(count.item()))  # sync point: once, before the first step


def gather_env_rows(env: DistEnv) -> list[dict]:
    """Every rank's facts, gathered to all ranks (a collective: call it on every rank)."""
    row = {"rank": env.rank, "local_rank": env.local_rank, "node": env.node_rank, "host": socket.gethostname(),
           "device": str(env.device), "threads": torch.get_num_threads(), "pid": os.getpid()}
    rows: list[dict] = [None] * env.world_size  # type: ignore[list-item]
    dist.all_gather_object(rows, row)
    return rows


def node_members(env: DistEnv) -> list[list[int]]:
    """Each node's ranks, in node order, from every rank's node (GROUP_RANK, SLURM_NODEID ...; a collective)."""
    nodes: list[int] = [0] * env.world_size
    dist.all_gather_object(nodes, env.node_rank)
    return [[r for r, n in enumerate(nodes) if n == node] for node in sorted(set(nodes))]


def shutdown() -> None:
    """Leave the process group if one is open, in the order that exits cleanly (``teardown.end_process_group``)."""
    from .teardown import end_process_group
    end_process_group(owned=True, barrier=False)


def cluster_fields(env: DistEnv) -> dict[str, Any]:
    """The run summary's node fields: nodes, processes per node (rank 0's node), and who placed the ranks."""
    return {"nodes": env.nnodes, "procs_per_node": env.local_world_size, "cluster_source": env.cluster_source}

