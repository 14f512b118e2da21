"""The cluster-environment resolver: which scheduler started this process, and where it stands in the job.

Sources are tried in order, and the first whose variables are present decides; each says why it was chosen:

0. **Ray Train** (a ``TorchTrainer`` worker: ``NODE_RANK`` beside torchrun's ``RANK``, ``WORLD_SIZE``,
   ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, in a Ray worker process): the process is a rank, and Ray Train has
   already made the process group. It comes first because Ray Train sets torchrun's variables too.
1. **torchrun** (or any launcher that sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``): the process is a rank.
2. **SLURM** inside an ``srun`` step (``SLURM_STEP_ID`` set): ``SLURM_NTASKS``, ``SLURM_PROCID``,
   ``SLURM_LOCALID``, ``SLURM_NODEID``; the master is the first host of the step's node list, on a port
   derived from the job id (every task computes the same one) unless ``MASTER_PORT`` is set. A SLURM job
   without a step (an ``salloc`` shell, the batch script itself) is not one of the job's tasks: single node.
3. **Kubeflow** (Trainer v2 TrainJob, a PyTorchJob with ``nprocPerNode``): ``PET_NNODES``,
   ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` (torchrun's own
   option variables), one pod per node.
4. **PyTorchJob** (Kubeflow's training operator, one process per pod): ``MASTER_ADDR``, ``MASTER_PORT``,
   ``WORLD_SIZE``, ``RANK``.
5. **A single node.**

A process asks in one of two roles: a *rank* (``trainscale.init()``: each scheduler task is one rank) or a
*launcher* (``trainscale launch``, ``trainscale train --nproc``: each task starts this node's ranks, so the
scheduler must run one task per node). Half-set or contradictory variables raise ``ClusterError``, one line.
Nothing here imports torch: the launcher answers bad input before torch loads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..config import ConfigError

__all__ = ["Cluster", "ClusterError", "resolve", "expand_nodelist", "slurm_port", "tasks_on_node", "unplaced"]

Role = Literal["rank", "launcher"]
SLURM_PORT_BASE = 20000  # derived ports lie in 20000-29999: below Linux's ephemeral range (32768-60999)


class ClusterError(ConfigError):
    """A scheduler's variables are half-set or contradict each other (one line: the variable, its value, why)."""


@dataclass(frozen=True)
class Cluster:
    """Where this process stands, as its scheduler says: node-level facts, and rank-level ones for a rank."""

    source: str  # ray | torchrun | slurm | kubeflow | pytorchjob | single
    why: str  # which variables decided, in words
    nnodes: str  # "N", or "MIN:MAX" for an elastic job (Kubeflow)
    node_rank: int
    master_addr: str | None
    master_port: int | None
    nproc_per_node: int | None = None  # what the scheduler asks each node to run (None: it does not say)
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def multi_node(self) -> bool:
        return self.source != "single"

    def describe(self) -> str:
        """One line for the environment table: the source and why."""
        return f"{self.source} ({self.why})"

    def rank_env(self) -> dict[str, str]:
        """The variables torch's ``env://`` initialisation and trainscale read, as torchrun would set them."""
        if self.master_addr is None or self.master_port is None:
            return {}
        return {"MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port), "RANK": str(self.rank),
                "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size), "GROUP_RANK": str(self.node_rank),
                "GROUP_WORLD_SIZE": self.nnodes}


def resolve(environ: Mapping[str, str] | None = None, role: Role = "rank") -> Cluster:
    """The first source whose variables are present, in the module's order; ``ClusterError`` when they are bad.

    Example::

        c = resolve({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
                     "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NNODES": "2",
                     "SLURM_JOB_NODELIST": "node[01-02]"})
        (c.source, c.rank, c.world_size, c.master_addr, c.master_port)  # ('slurm', 1, 2, 'node01', 20077)
    """
    env = os.environ if environ is None else environ
    for source in (_ray, _torchrun, _slurm, _kubeflow, _pytorchjob):
        found = source(env, role)
        if found is not None:
            return found
    return Cluster("single", _single_why(env), "1", 0, None, None)


# What makes a process one task of a launcher's or scheduler's job. A program that launches jobs of its own with
# explicit node options (the lab's runs, on one node or on all) leaves these out of their environment: else a
# 1-process run started inside an srun step or a Kubeflow pod takes itself for a task of the 2-node job, and
# waits for peers that never come.
PLACEMENT_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_STEP_ID", "SLURM_STEPID",
                  "PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NPROC_PER_NODE")


def unplaced(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the variables that place a process in a job (``PLACEMENT_VARS``)."""
    return {k: v for k, v in env.items() if k not in PLACEMENT_VARS}


# ------------------------------------------------------------------ sources
RAY_WORKER_VARS = ("RAY_RAYLET_PID", "RAY_JOB_ID")  # set by Ray in every worker process it starts


def _ray(env: Mapping[str, str], role: Role) -> Cluster | None:
    # Ray Train sets NODE_RANK (torchrun sets GROUP_RANK instead); a torchrun inside a Ray task stays torchrun's.
    if "NODE_RANK" not in env or not any(k in env for k in RAY_WORKER_VARS) or "TORCHELASTIC_RUN_ID" in env:
        return None
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    missing = [k for k in keys if k not in env]
    if missing:
        raise ClusterError("NODE_RANK", env["NODE_RANK"], f"a Ray Train worker's variables are half-set: "
                           f"{', '.join(missing)} missing (Ray Train sets them with NODE_RANK)")
    if role == "launcher":
        raise ClusterError("NODE_RANK", env["NODE_RANK"], "this process is a Ray Train worker (a rank): call "
                           "trainscale.init() in the training function, without a launcher")
    rank, world, local, local_world, node = (_int(env, k) for k in (*keys, "NODE_RANK"))
    _below("RANK", rank, "WORLD_SIZE", world)
    _below("LOCAL_RANK", local, "LOCAL_WORLD_SIZE", local_world)
    # Ray may place unequal worker counts per node; init_distributed counts the nodes once the group is up.
    nodes = max(node + 1, world // max(1, local_world))
    port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else None
    why = (f"Ray Train worker: rank {rank} of {world}, local rank {local} of {local_world} on node {node} "
           "(NODE_RANK); process group made by Ray Train's TorchTrainer")
    return Cluster("ray", why, str(nodes), node, env.get("MASTER_ADDR"), port, local_world, rank, world, local,
                   local_world)


def _torchrun(env: Mapping[str, str], role: Role) -> Cluster | None:
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    if "LOCAL_RANK" not in env:
        return None
    missing = [k for k in keys if k not in env]
    if missing:
        raise ClusterError("LOCAL_RANK", env["LOCAL_RANK"], f"a launcher's variables are half-set: {', '.join(missing)} "
                           "missing (torchrun sets RANK, WORLD_SIZE and LOCAL_RANK together)")
    if role == "launcher":
        raise ClusterError("RANK", env["RANK"], "this process is already a rank of a launched job (torchrun's "
                           "variables are set); run the script directly, without a second launcher")
    rank, world, local = (_int(env, k) for k in keys)
    local_world = _int(env, "LOCAL_WORLD_SIZE", 1)
    _below("RANK", rank, "WORLD_SIZE", world)
    _below("LOCAL_RANK", local, "LOCAL_WORLD_SIZE", local_world)
    node = _int(env, "GROUP_RANK", rank // max(1, local_world))
    nodes = _int(env, "GROUP_WORLD_SIZE", max(1, world // max(1, local_world)))
    who = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "a launcher (RANK, WORLD_SIZE, LOCAL_RANK)"
    return Cluster("torchrun", f"started by {who}", str(nodes), node, env.get("MASTER_ADDR"),
                   _int(env, "MASTER_PORT") if "MASTER_PORT" in env else None, local_world, rank, world, local,
                   local_world)


def _slurm(env: Mapping[str, str], role: Role) -> Cluster | None:
    if "SLURM_JOB_ID" not in env or not ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        return None  # no job, or no srun step: an salloc shell or the batch script is not one of the tasks
    for k in ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"):
        if k not in env:
            raise ClusterError(k, None, f"unset inside SLURM job {env['SLURM_JOB_ID']}'s srun step; srun sets "
                               "SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID and SLURM_NODEID together")
    ntasks, procid, localid, nodeid = (_int(env, k) for k in ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
                                                             "SLURM_NODEID"))
    nodes_key = next((k for k in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") if k in env), None)
    list_key = next((k for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if k in env), None)
    if list_key is None:
        raise ClusterError("SLURM_JOB_NODELIST", None, "unset: the master address is the first host of the job's "
                           "node list")
    hosts = expand_nodelist(env[list_key], list_key)
    nnodes = _int(env, nodes_key) if nodes_key else len(hosts)
    _below("SLURM_PROCID", procid, "SLURM_NTASKS", ntasks)
    _below("SLURM_NODEID", nodeid, nodes_key or list_key, nnodes)
    on_node = tasks_on_node(env, nodeid)
    if on_node is not None:
        _below("SLURM_LOCALID", localid, "the tasks on this node", on_node)
    port, port_why = _slurm_port(env)
    job = env["SLURM_JOB_ID"]
    why = (f"srun step of job {job}: task {procid} of {ntasks} on node {nodeid} of {nnodes}; master = first host of "
           f"{list_key} '{env[list_key]}', {port_why}")
    if role == "launcher":
        if on_node not in (None, 1):
            raise ClusterError("SLURM_TASKS_PER_NODE", env.get("SLURM_STEP_TASKS_PER_NODE",
                               env.get("SLURM_TASKS_PER_NODE")), f"{on_node} tasks on this node would each start a "
                               "launcher: run srun --ntasks-per-node=1 with trainscale launch (or srun one task per "
                               "rank with python SCRIPT, without a launcher)")
        return Cluster("slurm", why, str(nnodes), nodeid, hosts[0], port)
    local_world = on_node or max(1, ntasks // max(1, nnodes))
    return Cluster("slurm", why, str(nnodes), nodeid, hosts[0], port, local_world, procid, ntasks, localid, local_world)


def _kubeflow(env: Mapping[str, str], role: Role) -> Cluster | None:
    keys = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
    present = [k for k in (*keys, "PET_NPROC_PER_NODE") if k in env]
    if not present:
        return None
    missing = [k for k in keys if k not in env]
    if missing:
        raise ClusterError(missing[0], None, f"unset while {', '.join(present)} are set: Kubeflow sets PET_NNODES, "
                           "PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT together")
    nnodes = env["PET_NNODES"]
    lo, _, hi = nnodes.partition(":")
    if not (lo.isdigit() and (not hi or hi.isdigit())) or int(lo) < 1 or (hi and int(hi) < int(lo)):
        raise ClusterError("PET_NNODES", nnodes, "expected N or MIN:MAX with 1 <= MIN <= MAX")
    node, port = _int(env, "PET_NODE_RANK"), _int(env, "PET_MASTER_PORT")
    _below("PET_NODE_RANK", node, "PET_NNODES", int(nnodes.split(":")[-1]))
    nproc = _nproc(env.get("PET_NPROC_PER_NODE", "1"))
    why = (f"PET_* of a Kubeflow job: node {node} of {nnodes}, {nproc or 'auto'} process(es) per node, master "
           f"PET_MASTER_ADDR:PET_MASTER_PORT")
    if role == "launcher":
        return Cluster("kubeflow", why, nnodes, node, env["PET_MASTER_ADDR"], port, nproc)
    if hi and hi != lo:
        raise ClusterError("PET_NNODES", nnodes, "an elastic job needs a launcher: start the pod's command with "
                           "trainscale launch (or torchrun), which reads PET_*")
    if nproc != 1:
        raise ClusterError("PET_NPROC_PER_NODE", env.get("PET_NPROC_PER_NODE"), "more than one process per pod needs "
                           "a launcher: start the pod's command with trainscale launch (or torchrun), which reads PET_*")
    return Cluster("kubeflow", why, lo, node, env["PET_MASTER_ADDR"], port, 1, node, int(lo), 0, 1)


def _pytorchjob(env: Mapping[str, str], role: Role) -> Cluster | None:
    keys = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
    if "WORLD_SIZE" not in env and "RANK" not in env:
        return None  # MASTER_ADDR/MASTER_PORT alone: a single-process script's usual exports
    missing = [k for k in keys if k not in env]
    if missing:
        raise ClusterError(missing[0], None, f"unset while {', '.join(k for k in keys if k in env)} are set: a "
                           "PyTorchJob sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK together")
    world, rank, port = _int(env, "WORLD_SIZE"), _int(env, "RANK"), _int(env, "MASTER_PORT")
    _below("RANK", rank, "WORLD_SIZE", world)
    if role == "launcher":  # one pod per node: WORLD_SIZE counts pods, RANK is this pod's index
        why = f"PyTorchJob pod {rank} of {world} (RANK, WORLD_SIZE as node rank and nodes), master MASTER_ADDR"
        return Cluster("pytorchjob", why, str(world), rank, env["MASTER_ADDR"], port)
    why = f"PyTorchJob: rank {rank} of {world} (RANK, WORLD_SIZE), one process per pod, master MASTER_ADDR"
    return Cluster("pytorchjob", why, str(world), rank, env["MASTER_ADDR"], port, 1, rank, world, 0, 1)


def _single_why(env: Mapping[str, str]) -> str:
    if "SLURM_JOB_ID" in env:
        return (f"SLURM job {env['SLURM_JOB_ID']} without an srun step (an salloc shell or the batch script): this "
                "process is not one of the job's tasks; run it under srun to use every node")
    return "no launcher or scheduler variables"


# ------------------------------------------------------------------ SLURM details
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_nodelist(text: str, key: str = "SLURM_JOB_NODELIST") -> list[str]:
    """SLURM's compressed host list in full: ``node[01-03,07],gpu1`` -> node01 node02 node03 node07 gpu1."""
    hosts: list[str] = []
    for item in _split_top(text, key):
        names = [""]
        for literal, inside in re.findall(r"([^\[\]]*)(?:\[([^\[\]]*)\])?", item):
            names = [n + literal for n in names]
            if inside:
                names = [n + s for n in names for s in _expand_ranges(inside, text, key)]
        hosts += names
    if not hosts or any(not h for h in hosts):
        raise ClusterError(key, text, "not a SLURM host list (e.g. node[01-04,07],gpu1)")
    return hosts


def _split_top(text: str, key: str) -> list[str]:
    """Split at the commas outside brackets; an unbalanced bracket is an error."""
    items, depth, cur = [], 0, ""
    for ch in text.strip():
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise ClusterError(key, text, "unbalanced brackets in the host list")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ClusterError(key, text, "unbalanced brackets in the host list")
    return [*items, cur]


def _expand_ranges(inside: str, text: str, key: str) -> list[str]:
    out = []
    for part in inside.split(","):
        m = _RANGE.match(part.strip())
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise ClusterError(key, text, f"bad range '{part}' in the host list (expected N or A-B with A <= B)")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        out += [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]  # node[01-10] keeps its padding
    return out


def slurm_port(job_id: str) -> int:
    """The master port every task of a job derives alike: 20000 + the job id's last four digits."""
    digits = re.sub(r"\D", "", job_id)[-4:]  # an array task's id "1234_7" counts by its digits
    return SLURM_PORT_BASE + int(digits or 0)


def _slurm_port(env: Mapping[str, str]) -> tuple[int, str]:
    if "MASTER_PORT" in env:
        return _int(env, "MASTER_PORT"), "port MASTER_PORT"
    port = slurm_port(env["SLURM_JOB_ID"])
    return port, f"port {port} from the job id"


def tasks_on_node(env: Mapping[str, str], node: int) -> int | None:
    """Tasks SLURM runs on node ``node``, from ``SLURM_STEP_TASKS_PER_NODE``-style ``2(x3),1`` counts."""
    key = next((k for k in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if k in env), None)
    if key is None:
        return None
    counts: list[int] = []
    for part in env[key].split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ClusterError(key, env[key], "expected counts such as 2(x3),1")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if node >= len(counts):
        raise ClusterError("SLURM_NODEID", node, f"{key} '{env[key]}' lists {len(counts)} node(s)")
    return counts[node]


# ------------------------------------------------------------------ checks
def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    if key not in env and default is not None:
        return default
    value = env[key]
    try:
        n = int(value)
    except ValueError:
        raise ClusterError(key, value, "not an integer") from None
    if n < 0:
        raise ClusterError(key, value, "must be >= 0")
    return n


def _below(key: str, value: int, bound_key: str, bound: int) -> None:
    if value >= bound:
        raise ClusterError(key, value, f"must be below {bound_key} ({bound}): the variables contradict each other")


def _nproc(text: str) -> int | None:
    """PET_NPROC_PER_NODE: a count, or torchrun's auto/gpu/cpu (None: the launcher decides)."""
    if text in ("auto", "gpu", "cpu"):
        return None
    if not text.isdigit() or int(text) < 1:
        raise ClusterError("PET_NPROC_PER_NODE", text, "expected a count >= 1, or auto, gpu, cpu")
    return int(text)
