"""``trainscale launch``: run any torchrun script on N processes per node."""

from __future__ import annotations

import argparse
import sys

from ..config import ConfigError
from .launcher import LaunchFailed, LaunchSpec, launch

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Entry of ``trainscale launch``."""
    p = argparse.ArgumentParser(
        prog="trainscale launch",
        description="Run a training script on N processes per node through torch.distributed.run (torchrun), "
                    "so rendezvous, multi-node and elastic restarts behave exactly as torchrun's. Prints the "
                    "job's distributed environment once, and gives each rank cores/processes intra-op threads.",
        epilog="examples:\n  trainscale launch --nproc-per-node 2 train.py --epochs 3\n"
               "  trainscale launch --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 "
               "--nproc-per-node 8 train.py\n  trainscale launch --nnodes 1:4 --rdzv-endpoint head:29400 "
               "--max-restarts 3 --nproc-per-node 8 train.py\n"
               "  trainscale launch --slurm job.sbatch --nnodes 4 --nproc-per-node 8 train.py && sbatch job.sbatch\n"
               "  srun --ntasks-per-node=1 trainscale launch --nproc-per-node 8 train.py   # nodes from SLURM_*",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc-per-node", type=int, metavar="N",
                   help="processes on this node (default: what the scheduler asks for, e.g. Kubeflow's "
                        "PET_NPROC_PER_NODE, else 1)")
    p.add_argument("--nnodes", default="1", metavar="A[:B]", help="nodes, or MIN:MAX for an elastic job")
    p.add_argument("--node-rank", type=int, default=0, metavar="R", help="this node's rank (static rendezvous)")
    p.add_argument("--master-addr", metavar="H", help="address of node 0 (static rendezvous)")
    p.add_argument("--master-port", type=int, metavar="P", help="port on node 0 (static rendezvous)")
    p.add_argument("--rdzv-endpoint", metavar="H:P", help="c10d rendezvous endpoint (elastic jobs)")
    p.add_argument("--rdzv-id", default="trainscale", help="job id shared by all nodes of a c10d rendezvous")
    p.add_argument("--rdzv-conf", default="", metavar="K=V,...",
                   help="torchrun's c10d rendezvous settings, e.g. keep_alive_interval=1,keep_alive_max_attempt=3 "
                        "(a dead node leaves the rendezvous after interval x attempts seconds; default 5 x 3)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="K", help="restart the workers up to K times")
    p.add_argument("--threads", type=int, default=0, metavar="T",
                   help="intra-op threads per rank (default: cores / processes on this node)")
    p.add_argument("--slurm", nargs="?", const="-", metavar="FILE",
                   help="print (or write to FILE) the sbatch script that runs this launch on --nnodes N nodes, one "
                        "launcher per node, instead of launching")
    p.add_argument("-m", "--module", action="store_true", help="SCRIPT is a Python module (python -m)")
    p.add_argument("script", metavar="SCRIPT", help="the training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments passed to the script")
    a = p.parse_args(argv)
    if a.nproc_per_node is not None and a.nproc_per_node < 1:
        raise ConfigError("--nproc-per-node", a.nproc_per_node, "must be >= 1")
    spec = LaunchSpec(script=a.script, args=a.args, nproc_per_node=a.nproc_per_node or 0, nnodes=a.nnodes,
                      node_rank=a.node_rank, master_addr=a.master_addr, master_port=a.master_port,
                      rdzv_endpoint=a.rdzv_endpoint, rdzv_id=a.rdzv_id, rdzv_conf=a.rdzv_conf,
                      max_restarts=a.max_restarts,
                      threads=a.threads, module=a.module)
    spec.validate()  # bad input answered before torch is imported
    if a.slurm:
        return _slurm(spec, a.slurm)
    try:
        launch(spec)
    except LaunchFailed as e:
        print(f"trainscale launch: {e}", file=sys.stderr)
        return 1
    return 0


def _slurm(spec: LaunchSpec, dest: str) -> int:
    """``--slurm``: the batch script instead of a launch (nodes are placed by SLURM, not by options)."""
    from .slurm import sbatch_script, write_script

    if ":" in spec.nnodes or spec.node_rank or spec.master_addr or spec.master_port or spec.rdzv_endpoint:
        raise ConfigError("--slurm", dest, "takes --nnodes N only; SLURM gives each node its rank and the master")
    write_script(sbatch_script(spec, int(spec.nnodes)), dest)
    return 0
