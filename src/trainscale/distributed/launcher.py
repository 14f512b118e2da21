"""``trainscale launch``: a thin wrapper over ``torch.distributed.run`` (torchrun).

Rendezvous, elastic restarts and worker supervision are torchrun's own; this module only builds
its arguments, sets intra-op threads per rank, and prints the job's distributed environment once.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..config import ConfigError
from .cluster import Cluster, resolve
from .table import print_env_table

# What a rank's error reads like when a peer's exit closed its connections (Gloo's pair, the TCP store, NCCL).
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "failed to recv, got 0 bytes",
             "remote process exited")
PREEMPTED_CODE = 75  # what a rank exits with after a preemption checkpoint (trainscale.train.survive.preempt.EXIT_PREEMPTED)

__all__ = ["LaunchSpec", "launch", "LaunchFailed", "Preempted", "with_cluster"]


class LaunchFailed(RuntimeError):
    """The job ended with a failed rank; the message names it and its error; ``exitcodes``: every failed rank's."""

    def __init__(self, message: str, exitcodes: dict[int, int] | None = None):
        super().__init__(message)
        self.exitcodes = exitcodes or {}


class Preempted(RuntimeError):
    """The launcher got SIGTERM (or every rank stopped on one): the ranks checkpointed and exited."""


@dataclass
class LaunchSpec:
    """What to launch and how (the arguments of ``trainscale launch``)."""

    script: str
    args: list[str] = field(default_factory=list)
    nproc_per_node: int = 1  # 0: what the scheduler asks for (Kubeflow's PET_NPROC_PER_NODE), else 1
    nnodes: str = "1"
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str = "trainscale"
    rdzv_conf: str = ""  # torchrun's --rdzv-conf, e.g. keep_alive_interval=1 (a dead node is noticed sooner)
    max_restarts: int = 0
    shutdown_timeout: int = 30  # after a signal to the launcher, seconds the ranks get to exit before SIGKILL
    threads: int = 0
    module: bool = False
    print_table: bool = True

    def validate(self) -> None:
        """Refuse what torchrun would fail on later, with one clear line."""
        if self.nproc_per_node < 0:
            raise ConfigError("--nproc-per-node", self.nproc_per_node, "must be >= 1")
        lo, _, hi = self.nnodes.partition(":")
        if not (lo.isdigit() and (not hi or hi.isdigit())) or int(lo) < 1 or (hi and int(hi) < int(lo)):
            raise ConfigError("--nnodes", self.nnodes, "expected N or MIN:MAX with 1 <= MIN <= MAX")
        if self.max_restarts < 0:
            raise ConfigError("--max-restarts", self.max_restarts, "must be >= 0")
        if self.threads < 0:
            raise ConfigError("--threads", self.threads, "must be >= 0 (0: cores / local processes)")
        if self.rdzv_endpoint and (self.master_addr or self.master_port):
            raise ConfigError("--rdzv-endpoint", self.rdzv_endpoint, "give either it or --master-addr/--master-port")
        if not self.module and not Path(self.script).is_file():
            raise ConfigError("SCRIPT", self.script, "no such file (give a Python script, or -m MODULE)")

    @property
    def node_options_given(self) -> bool:
        """True when the command line placed this node (then the scheduler's variables are not read)."""
        return bool(self.nnodes != "1" or self.node_rank or self.master_addr or self.master_port or self.rdzv_endpoint)

    @property
    def max_nodes(self) -> int:
        return int(self.nnodes.split(":")[-1])

    def torchrun_argv(self) -> list[str]:
        """torchrun's options and the script (its arguments are attached after parsing, see ``launch``)."""
        argv = [f"--nproc-per-node={self.nproc_per_node}", f"--nnodes={self.nnodes}",
                f"--max-restarts={self.max_restarts}"]
        if _torchrun_has("--shutdown-timeout"):  # torch >= 2.12; older torchruns wait a fixed 30 s
            argv.append(f"--shutdown-timeout={self.shutdown_timeout}")
        if self.rdzv_endpoint:
            argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={self.rdzv_endpoint}", f"--rdzv-id={self.rdzv_id}"]
            argv += [f"--rdzv-conf={self.rdzv_conf}"] if self.rdzv_conf else []
        elif self.master_addr or self.master_port or self.max_nodes > 1:
            argv += [f"--node-rank={self.node_rank}", f"--master-addr={self.master_addr or '127.0.0.1'}",
                     f"--master-port={self.master_port or 29500}"]
        else:
            argv.append("--standalone")  # one node: torchrun picks a free port itself
        if self.module:
            argv.append("-m")
        return argv + [self.script]


def launch(spec: LaunchSpec) -> None:
    """Run ``spec`` under torchrun on this node; raise LaunchFailed if a rank fails, Preempted on SIGTERM.

    torchrun forwards SIGTERM to the ranks and gives them ``spec.shutdown_timeout`` seconds before SIGKILL.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from .env import default_threads

    spec, cluster = with_cluster(spec)
    spec.validate()
    threads = spec.threads or int(os.environ.get("OMP_NUM_THREADS", 0)) or default_threads(spec.nproc_per_node)
    # torchrun would otherwise force OMP_NUM_THREADS=1 on every rank (the num_threads question of PaddlePaddle's tuning guide).
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if spec.print_table and spec.node_rank == 0:
        os.environ["TRAINSCALE_TABLE_PRINTED"] = "1"  # the ranks need not print it again
        print_env_table(_expected_rows(spec, threads), world=_world_text(spec), nodes=spec.nnodes,
                        master=_master_text(spec), backend=_expected_backend(spec.nproc_per_node),
                        source=cluster.describe())
    if spec.rdzv_endpoint:
        # Each rendezvous round gets a store of its own (hosted by its rank 0), not the agent's shared one that
        # outlives rounds: a node's launcher brought back counts its attempts from 0 again, so no attempt
        # prefix can keep a round's keys apart from the previous round's there.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    args = parse_args(spec.torchrun_argv())
    # Attached after parsing: torchrun's argparse would take a script option such as --nproc for an
    # abbreviation of its own --nproc-per-node.
    args.training_script_args = list(spec.args)
    # torchrun keeps each rank's error file in a log folder, by default a new temporary one per launch that it
    # never removes (the lab launches dozens of runs): one of ours, read while failing and removed after.
    args.log_dir = tempfile.mkdtemp(prefix="trainscale-torchrun-")
    try:
        run(args)
    except ChildFailedError as e:
        codes = {rank: f.exitcode for rank, f in (getattr(e, "failures", {}) or {}).items()}
        if codes and all(c == PREEMPTED_CODE for c in codes.values()):
            raise Preempted("every rank stopped on SIGTERM") from None
        raise LaunchFailed(_failure_text(e, args.log_dir), codes) from None
    except SignalException as e:
        if e.sigval != signal.SIGTERM:
            raise
        raise Preempted("the launcher got SIGTERM") from None
    finally:
        shutil.rmtree(args.log_dir, ignore_errors=True)


def with_cluster(spec: LaunchSpec, environ: dict[str, str] | None = None) -> tuple[LaunchSpec, Cluster]:
    """``spec`` placed by the scheduler (SLURM, Kubeflow, PyTorchJob) unless its command line placed it.

    Example::

        spec, cluster = with_cluster(LaunchSpec("train.py", nproc_per_node=4))  # under srun: nodes from SLURM_*
    """
    if spec.node_options_given:
        how = f"--nnodes {spec.nnodes}" + (f", --rdzv-endpoint {spec.rdzv_endpoint}" if spec.rdzv_endpoint else
                                           f", --node-rank {spec.node_rank}")
        return replace(spec, nproc_per_node=spec.nproc_per_node or 1), Cluster("command line", how, spec.nnodes,
                                                                             spec.node_rank, spec.master_addr,
                                                                             spec.master_port)
    c = resolve(environ, role="launcher")
    nproc = spec.nproc_per_node or c.nproc_per_node or (_auto_nproc() if c.source == "kubeflow" else 1)
    if not c.multi_node:
        return replace(spec, nproc_per_node=nproc), c
    if ":" in c.nnodes and len(set(c.nnodes.split(":"))) > 1:  # elastic: torchrun needs a c10d rendezvous
        endpoint = (environ or os.environ).get("PET_RDZV_ENDPOINT") or f"{c.master_addr}:{c.master_port}"
        return replace(spec, nproc_per_node=nproc, nnodes=c.nnodes, rdzv_endpoint=endpoint), c
    return replace(spec, nproc_per_node=nproc, nnodes=c.nnodes, node_rank=c.node_rank, master_addr=c.master_addr,
                   master_port=c.master_port), c


def _auto_nproc() -> int:
    """torchrun's ``--nproc-per-node auto``: one process per accelerator, else per CPU."""
    import torch

    return torch.cuda.device_count() or os.cpu_count() or 1


def _expected_backend(local_processes: int) -> str:
    import torch

    gpus = torch.cuda.device_count()
    if not gpus:
        return "gloo (no CUDA)"
    if local_processes > gpus:
        return f"gloo on CUDA ({local_processes} processes share {gpus} GPU(s); NCCL needs one each)"
    return "nccl (CUDA available)"


def _world_text(spec: LaunchSpec) -> str:
    if ":" in spec.nnodes and len(set(spec.nnodes.split(":"))) > 1:
        return f"{spec.nproc_per_node} x nodes ({spec.nnodes}, elastic)"
    return str(spec.nproc_per_node * spec.max_nodes)


def _master_text(spec: LaunchSpec) -> str:
    if spec.rdzv_endpoint:
        return f"{spec.rdzv_endpoint} (c10d rendezvous)"
    if spec.master_addr or spec.master_port or spec.max_nodes > 1:
        return f"{spec.master_addr or '127.0.0.1'}:{spec.master_port or 29500}"
    return "localhost:(free port, standalone)"


def _expected_rows(spec: LaunchSpec, threads: int) -> list[dict]:
    import torch

    static = not spec.rdzv_endpoint and ":" not in spec.nnodes
    ngpu = torch.cuda.device_count()
    rows = []
    for lr in range(spec.nproc_per_node):
        rows.append({"rank": spec.node_rank * spec.nproc_per_node + lr if static else "at rendezvous",
                     "local_rank": lr, "node": spec.node_rank,
                     "device": f"cuda:{lr % ngpu}" if ngpu else "cpu", "threads": threads})
    return rows


def _failure_text(err: Exception, log_dir: str | None = None) -> str:
    """The root-cause rank and its error: the first to exit on its own, not those torchrun then stopped.

    A watchdog's verdict (``RankHung``, which names the culprit it then killed) comes first; then a rank killed
    by SIGKILL (``kill -9``, the OOM killer: torchrun sends SIGTERM first), whose peers fail on the lost
    connection in the same instant; then a rank's own error (its exit code, or the error file it wrote before
    torchrun's SIGTERM found it still tearing down); then other signals; then the exits on a lost connection,
    which a peer's exit caused (timestamps cannot order the two: torchrun's are whole seconds, and a loaded host
    puts both exits in the same one); last SIGTERM, which torchrun sends to the ranks still running.

    Where the failed ranks stood in different collectives (one skipped a collective, or gave another shape), the
    line starts with the mismatch (``_mismatch``): Gloo aborts the rank that receives the unexpected size, and its
    peer fails on the lost connection, so neither exit alone says what happened.
    """
    failures = getattr(err, "failures", {}) or {}
    if not failures:
        return str(err)

    def order(kv: tuple[int, Any]) -> tuple[int, Any, int]:
        f = kv[1]
        msg = str(f.message.get("message", "") if isinstance(f.message, dict) else "")
        cls = (0 if "RankHung" in msg else 1 if f.exitcode == -signal.SIGKILL else
               4 if any(p in msg for p in PEER_LOST) else 2 if f.exitcode >= 0 or msg else
               5 if f.exitcode == -signal.SIGTERM else 3)
        return cls, f.timestamp, kv[0]

    rank, f = min(failures.items(), key=order)
    msg = f.message.get("message", "") if isinstance(f.message, dict) else ""
    lines = [ln for ln in str(msg).strip().splitlines() if ln.strip()] if f.error_file_data else []
    detail = lines[-1] if lines else (f"killed by {f.signal_name()}" if f.exitcode < 0 else
                                      f"exit code {f.exitcode} (its traceback is above)")
    where = _where_each_stood(failures, log_dir)
    if rank in where and "seq" not in where[rank]:  # ended by a signal inside a collective
        detail += f", inside {where[rank]['op']} at {where[rank]['at']}"
    odd = _mismatch(where)
    return f"{odd}; rank {rank} failed: {detail}" if odd else f"rank {rank} failed: {detail}"


def _where_each_stood(failures: dict[int, Any], log_dir: str | None) -> dict[int, dict[str, Any]]:
    """Each failed rank's collective and place in the code: from its error file (``hangs.at_failure``), or, for a
    rank ended by a signal, from the stacks faulthandler wrote beside it (op and place, no number or sizes)."""
    from .hangs import FATAL_STACKS, fatal_position

    out: dict[int, dict[str, Any]] = {}
    for rank, f in failures.items():
        extra = f.message.get("extraInfo") if isinstance(f.message, dict) else None
        if isinstance(extra, dict) and extra.get("trainscale"):
            out[rank] = extra["trainscale"]
        elif f.exitcode < 0 and log_dir:
            dumps = sorted(Path(log_dir).glob(f"*/attempt_*/{f.local_rank}/{FATAL_STACKS}"),
                           key=lambda p: p.stat().st_mtime)
            text = dumps[-1].read_text(errors="replace") if dumps else ""
            if (pos := fatal_position(text)) is not None:
                out[rank] = pos
    return out


def _mismatch(where: dict[int, dict[str, Any]]) -> str:
    """One line when the failed ranks stood in different collectives, else ''.

    Ranks with a recorded collective are compared number by number (``hangs.mismatch``). A rank ended by a signal
    has no number: it is compared by op and place with the others' newest, and differs when either does.
    """
    from .hangs import mismatch

    numbered = {r: w for r, w in where.items() if "seq" in w}
    if line := mismatch(numbered):
        return line
    if len(numbered) in (0, len(where)) or len({(w["op"], w["at"]) for w in where.values()}) < 2:
        return ""
    parts = [f"rank {r} {w['op']} {w['sizes']} at {w['at']} (its #{w['seq']})" if "seq" in w else
             f"rank {r} {w['op']} at {w['at']} (ended by a signal inside it: no sizes recorded)"
             for r, w in sorted(where.items())]
    return "mismatched collective: " + ", ".join(parts)


@functools.cache
def _torchrun_has(option: str) -> bool:
    """Whether this torch's torchrun accepts ``option``."""
    from torch.distributed.run import get_args_parser

    return any(option in a.option_strings for a in get_args_parser()._actions)
