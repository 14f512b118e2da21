"""``trainscale launch --slurm``: the ``sbatch`` script that runs one launcher per node.

srun starts one task per node; each task is ``trainscale launch``, which reads its node rank, the node count
and the master (the first node, on a port derived from the job id) from SLURM's variables through
``cluster.resolve`` and starts that node's ranks under torchrun.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from pathlib import Path

from ..config import ConfigError
from .launcher import LaunchSpec

__all__ = ["sbatch_script", "write_script"]


def sbatch_script(spec: LaunchSpec, nodes: int, python: str | None = None, job_name: str = "trainscale") -> str:
    """The batch script for ``nodes`` nodes of ``spec.nproc_per_node`` ranks each (``sbatch`` it as it is).

    Example::

        print(sbatch_script(LaunchSpec("train.py", ["--steps", "100"], nproc_per_node=4), nodes=2))
    """
    if nodes < 1:
        raise ConfigError("--nnodes", nodes, "the SLURM script needs a node count >= 1 (--nnodes N)")
    nproc = max(1, spec.nproc_per_node)
    launch = [python or sys.executable, "-m", "trainscale", "launch", "--nproc-per-node", str(nproc)]
    if spec.max_restarts:
        launch += ["--max-restarts", str(spec.max_restarts)]
    if spec.threads:
        launch += ["--threads", str(spec.threads)]
    script = spec.script if spec.module else str(Path(spec.script).resolve())
    launch += [*(["-m"] if spec.module else []), script, *spec.args]
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1          # one trainscale launcher per node; it starts the node's ranks",
        f"##SBATCH --gpus-per-node={nproc}          # on GPU nodes: one GPU per rank (remove one '#' to use)",
        "##SBATCH --time=01:00:00",
        "##SBATCH --partition=PARTITION",
        "",
        "# Each launcher reads SLURM_NODEID (its node rank), SLURM_NNODES and the first host of",
        "# SLURM_STEP_NODELIST (the master, on port 20000 + the job id's last four digits, or MASTER_PORT).",
        f"cd {shlex.quote(os.getcwd())}",
        "srun --kill-on-bad-exit=1 " + shlex.join(launch),
        "",
    ])


def write_script(text: str, dest: str) -> None:
    """Print ``text`` (``dest`` is ``-``) or write it to ``dest`` whole: a temporary file renamed into place."""
    if dest == "-":
        sys.stdout.write(text)
        return
    path = Path(dest)
    if path.is_dir() or not path.parent.is_dir():
        raise ConfigError("--slurm", dest, "give a file path in an existing folder (or no value to print)")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
