"""What a scheduler gives each process, emulated on this host: one subprocess per "node" or task.

``srun_env`` is the set of variables srun documents for a task of a step (man srun, OUTPUT ENVIRONMENT
VARIABLES); ``pet_env`` is what Kubeflow's torch runtime sets in each pod. Nodes are 127.0.0.1 and
127.0.0.2, both loopback, so the node list really is expanded and its first host really is the master.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

from clitools import REPO

SCRIPT = REPO / "tests" / "runapi" / "parity_script.py"  # mlp on digits, 8 steps; rank 0 saves the weights
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID")


def free_port(lo: int = 20000, hi: int = 29999) -> int:
    """A port free on 127.0.0.1 in [lo, hi] (SLURM's derived ports lie in 20000-29999)."""
    for _ in range(200):
        port = random.randint(lo, hi)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def slurm_job_for_free_port() -> str:
    """A job id whose derived master port (20000 + its last four digits) is free here."""
    return f"7{free_port() - 20000:04d}"


def srun_env(job: str, nodes: int, tasks_per_node: int, procid: int) -> dict[str, str]:
    """srun's variables for task ``procid`` of a step over ``nodes`` x ``tasks_per_node`` (block distribution)."""
    nodelist = f"127.0.0.[1-{nodes}]"
    node = procid // tasks_per_node
    return {"SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_JOB_NAME": "train", "SLURM_STEP_ID": "0",
            "SLURM_STEPID": "0", "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
            "SLURM_STEP_NODELIST": nodelist, "SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes),
            "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_NTASKS": str(nodes * tasks_per_node),
            "SLURM_NPROCS": str(nodes * tasks_per_node), "SLURM_STEP_NUM_TASKS": str(nodes * tasks_per_node),
            "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})",
            "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})", "SLURM_PROCID": str(procid),
            "SLURM_LOCALID": str(procid % tasks_per_node), "SLURM_NODEID": str(node),
            "SLURMD_NODENAME": f"127.0.0.{node + 1}"}


def pet_env(nodes: int, nproc: int, node: int, port: int) -> dict[str, str]:
    """Kubeflow's PET_* for pod ``node`` (the torch runtime's torchrun options as variables)."""
    return {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(nproc), "PET_NODE_RANK": str(node),
            "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}


def spawn(argv: list[str], extra: dict[str, str]) -> subprocess.Popen:
    """Start ``argv`` (``python`` is this interpreter) as one node's task, with ``extra`` over a clean environment."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(("SLURM_", "PET_"))}
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra})
    argv = [sys.executable if a == "python" else a for a in argv]
    return subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    """Every process's (exit code, stderr); any still running at ``timeout`` is killed (never left behind)."""
    out = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            _, err = p.communicate()
        out.append((p.returncode, err))
    return out


def script_command(sbatch: Path) -> list[str]:
    """The command after ``srun`` and its options in a batch script: what each node's task runs."""
    import shlex

    line = next(ln for ln in sbatch.read_text().splitlines() if ln.startswith("srun "))
    words = shlex.split(line)[1:]
    while words[0].startswith("-"):
        words.pop(0)
    return words


def srun_cyclic_env(job: str, nodes: int, tasks_per_node: int, procid: int) -> dict[str, str]:
    """srun --distribution=cyclic: task i on node i mod nodes, so a node's ranks are not consecutive."""
    env = srun_env(job, nodes, tasks_per_node, procid)
    env.update({"SLURM_NODEID": str(procid % nodes), "SLURM_LOCALID": str(procid // nodes),
                "SLURMD_NODENAME": f"127.0.0.{procid % nodes + 1}"})
    return env


def assert_same_weights(path: Path, want: dict) -> None:
    """The state dict saved at ``path`` equals ``want`` bit for bit."""
    import torch

    got = torch.load(path, weights_only=True)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), f"{k} differs from the plain launch"
