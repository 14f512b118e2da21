"""Run a job as a subprocess and read its summary: the lab's, the planner's and the benchmarks' only view of a job.

A job is ``trainscale train [options]`` or a user's own script on the run API
(``trainscale launch --nproc-per-node N script.py args``, its experiment switched on through
``TRAINSCALE_ARGS`` and its summary asked for through ``TRAINSCALE_JSON``). Each run gets a folder of its own
(``job.out``, the summary's path without ``.json``) for its metrics.jsonl, timeline and profiles, so runs never
write over each other's files. Every experiment of ``bench``
and ``doctor`` is a command a user could type (``RunSpec.shell``), so any number in a report can be
reproduced by hand.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import Config, ConfigError
from .distributed.cluster import unplaced
from .signals import interrupt_on

__all__ = ["RunSpec", "RunFailed", "run_train", "LauncherOptions", "split_script", "communicate_or_kill",
           "check_train_args", "to_overrides", "instrumented", "gpu_shortage"]

# What a script must do for the lab to read it: the one thing to add, quoted in the error.
API_HINT = ("the script wrote no run summary: it must use the run API -- add `run = trainscale.init()` before "
            "the loop and `run.finish()` after it (see examples/ in trainscale's repository)")


_RESERVED = ("--json", "--nproc", "--log.progress", "--print-config", "--job.out")

# Set by ``nodes.leading`` while node 0 leads a lab on several nodes: (command, env, label) of each multi-node run,
# called before it is launched, so that the other nodes start their part of it.
on_launch: Callable[[list[str], dict[str, str], str], None] | None = None


def check_train_args(args: list[str]) -> Config:
    """Validate the train options before any run starts (a typo fails now, not after minutes)."""
    from .train_options import parse

    for a in args:
        if a.split("=", 1)[0] in _RESERVED:
            raise ConfigError(a.split("=", 1)[0], a, "set by the lab itself for each run; leave it out")
    _, cfg = parse(list(args))
    return cfg


def to_overrides(args: list[str]) -> list[str]:
    """Train options (short ones too: ``--steps``, ``--profile``) as ``--section.field value`` pairs for a script.

    A script on the run API reads only those pairs (``TRAINSCALE_ARGS``): every field the options set is
    listed, plus ``job.steps`` whenever the options name a step count, even the default one.
    """
    from .config import config_to_dict
    from .train_options import parse

    _, cfg = parse(list(args))
    new, old = config_to_dict(cfg), config_to_dict(Config())
    steps_given = any(a.split("=", 1)[0] in ("--steps", "--job.steps") for a in args)
    out: list[str] = []
    for sec, fields in new.items():
        for k, v in fields.items():
            if v != old[sec][k] or (sec, k) == ("job", "steps") and steps_given:
                out += [f"--{sec}.{k}", str(v).lower() if isinstance(v, bool) else str(v)]
    return out


def split_script(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``[lab options] -- <the user's command>`` -> (lab options, the script's command for the launcher).

    The command is one a user runs (``[python] train.py``, ``torchrun --nproc-per-node K train.py``, ``accelerate
    launch --num_processes K train.py``, ``-m package.module`` as torchrun takes it): the lab owns the launch, so
    the launcher and its process count are dropped and the script with its arguments kept.
    """
    from .inject.command import parse_command

    if "--" not in argv:
        return argv, None
    i = argv.index("--")
    return argv[:i], parse_command(argv[i + 1:]).script


def instrumented(script: list[str] | None) -> bool:
    """A script not on the run API: trainscale instruments its ranks from outside (``trainscale.inject``)."""
    from .inject.command import uses_run_api

    return script is not None and not uses_run_api(script)


class RunFailed(RuntimeError):
    """A training run ended with an error (or timed out); ``detail`` holds its last error lines."""

    def __init__(self, spec: RunSpec, detail: str):
        self.spec, self.detail = spec, detail
        super().__init__(f"{spec.label} failed: {detail}")


@dataclass
class LauncherOptions:
    """Multi-node options handed to the launcher (``trainscale launch``, i.e. torchrun)."""

    nnodes: str = "1"
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None

    @property
    def multi_node(self) -> bool:
        return self.nnodes != "1" or bool(self.rdzv_endpoint or self.master_addr)

    def argv(self) -> list[str]:
        out = ["--nnodes", self.nnodes, "--node-rank", str(self.node_rank)]
        if self.master_addr:
            out += ["--master-addr", self.master_addr]
        if self.master_port:
            out += ["--master-port", str(self.master_port)]
        if self.rdzv_endpoint:
            out += ["--rdzv-endpoint", self.rdzv_endpoint]
        return out


@dataclass
class RunSpec:
    """One training run: processes per node, the user's train options plus the experiment's own."""

    nproc: int
    args: list[str]
    json_path: Path
    label: str = ""
    launcher: LauncherOptions = field(default_factory=LauncherOptions)
    script: list[str] | None = None  # a user's script (on the run API, or instrumented from outside) instead of train

    @property
    def injected(self) -> bool:
        """A script not on the run API: trainscale instruments its ranks from outside (``trainscale.inject``)."""
        return instrumented(self.script)

    @property
    def folder(self) -> Path:
        """The run's own folder (its ``job.out``): beside the summary, named like it."""
        return self.json_path.with_suffix("")

    def train_args(self) -> list[str]:
        """The options the run gets: the experiment's, then its own folder."""
        return [*self.args, "--job.out", str(self.folder)]

    def env(self) -> dict[str, str]:
        """Variables the run reads: a script's experiment switches and where its summary goes."""
        if not self.script:
            return {}
        switches = [*to_overrides(self.train_args()), "--log.progress", "none"]
        env = {"TRAINSCALE_ARGS": " ".join(shlex.quote(a) for a in switches), "TRAINSCALE_JSON": str(self.json_path)}
        if self.injected:
            from .inject import ENABLE, pythonpath

            env.update({ENABLE: "1", "PYTHONPATH": pythonpath(os.environ.get("PYTHONPATH", ""))})
        return env

    def command(self) -> list[str]:
        """The exact command line run for this experiment."""
        if self.script:
            extra = self.launcher.argv() if self.launcher.multi_node else []
            if self.injected:  # the same intra-op threads at 1 and N: torchrun would pin 1 at N only
                extra += ["--threads", str(_threads(self.args))]
            return [sys.executable, "-m", "trainscale", "launch", "--nproc-per-node", str(self.nproc), *extra,
                    *self.script]
        train = ["train", *self.train_args(), "--json", str(self.json_path), "--log.progress", "none"]
        if self.launcher.multi_node:
            return [sys.executable, "-m", "trainscale", "launch", "--nproc-per-node", str(self.nproc),
                    *self.launcher.argv(), "-m", "trainscale", *train]
        return [sys.executable, "-m", "trainscale", "train", "--nproc", str(self.nproc), *train[1:]]

    def shell(self) -> str:
        """The command as a user would type it."""
        cmd = self.command()
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env().items())
        return (env + " " if env else "") + "trainscale " + " ".join(shlex.quote(c) for c in cmd[3:])


def _threads(args: list[str]) -> int:
    """The intra-op threads the options give (``--job.threads T``), else 0 (the launcher's default)."""
    for i, a in enumerate(args):
        key, eq, value = a.partition("=")
        if key == "--job.threads":
            return int(value if eq else args[i + 1])
    return 0


def _error_lines(text: str, keep: int = 6) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errs = [ln for ln in lines if "Error" in ln or "error" in ln or "failed" in ln]
    chosen = (errs or lines)[-keep:]
    return " | ".join(ln.strip() for ln in chosen) or "no output"


# What a rank's traceback says when it asked for a GPU the node does not have: CUDA's own error, or DDP's stream
# table indexed by device_ids=[local_rank] (accelerate's and the Trainer's DDP wrapper on one GPU, torch 2.11).
_NO_SUCH_GPU = ("invalid device ordinal", "_streams[device.index]")


def gpu_shortage(text: str, nproc: int, gpus: int) -> str:
    """Why a run of ``nproc`` processes per node on ``gpus`` GPUs failed, when ``text`` shows a rank reaching for a
    GPU that is not there; else the empty string."""
    if not 0 < gpus < nproc or not any(m in text for m in _NO_SUCH_GPU):
        return ""
    return (f"{nproc} processes share this node's {gpus} GPU(s) and a rank asked for one that is not there: the "
            "script, or its framework (accelerate and the Hugging Face Trainer put local rank k on cuda:k), needs a "
            f"GPU per process; run it on a node with {nproc} GPUs, or on the CPU | ")


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def run_train(spec: RunSpec, timeout: float) -> dict[str, Any]:
    """Run one training job; return its summary, or raise RunFailed with the job's own error."""
    spec.json_path.parent.mkdir(parents=True, exist_ok=True)
    spec.json_path.unlink(missing_ok=True)
    spec.json_path.with_name(spec.json_path.name + ".why").unlink(missing_ok=True)
    # The lab is never itself a rank, nor a scheduler's task: each run is placed by its own launcher options.
    env = {**unplaced(os.environ), "TRAINSCALE_TABLE_PRINTED": "1", "PYTHONUNBUFFERED": "1", **spec.env()}
    if spec.launcher.multi_node and on_launch is not None:  # the other nodes of a lab launch their part of it
        on_launch(spec.command(), spec.env(), spec.label)
    try:
        rc, out, err = communicate_or_kill(spec.command(), env, timeout)
    except subprocess.TimeoutExpired:
        raise RunFailed(spec, f"no result within {timeout:g}s (timed out; its processes were ended)") from None
    # The job's own output, kept beside its summary: the evidence behind a number or a failure.
    log = spec.json_path.with_suffix(".log")
    log.write_text(f"$ {spec.shell()}\n{out}\n{err}")
    why = spec.json_path.with_name(spec.json_path.name + ".why")
    # An instrumented script's rank 0 says why it has no summary; kept first when another rank then failed too
    said = why.read_text().strip() if not spec.json_path.is_file() and why.is_file() else ""
    if rc != 0:
        raise RunFailed(spec, (said + " | " if said else "") + gpu_shortage(err + out, spec.nproc, _visible_gpus())
                        + _error_lines(err + "\n" + out) + f" (full output: {log})")
    if said:
        raise RunFailed(spec, said + f" (full output: {log})")
    if not spec.json_path.is_file():
        raise RunFailed(spec, (API_HINT if spec.script else "no run summary written") + f" (full output: {log})")
    from .schema import read_summary
    summary = read_summary(spec.json_path)  # nulls (unmeasured numbers) back to NaN, as the analysis expects
    summary["command"] = spec.shell()
    return summary


def communicate_or_kill(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """Run ``cmd`` to its end: (exit code, stdout, stderr). Past ``timeout``, or on Ctrl-C or SIGTERM to this
    process, its whole process tree is killed first (then TimeoutExpired or KeyboardInterrupt is raised)."""
    # A session of its own: Ctrl-C at the terminal reaches this process alone, which then ends the whole tree.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        with interrupt_on(signal.SIGTERM):  # `kill`, a scheduler: what is in flight must not outlive us
            out, err = p.communicate(timeout=timeout)
    except BaseException:
        _kill_tree(p)
        raise
    return p.returncode, out, err


def _kill_tree(p: subprocess.Popen) -> None:
    """SIGKILL the run's launcher and every process under it, then collect its output.

    torchrun starts each rank in a session of its own, so the launcher's process group does not hold the ranks:
    the tree is listed first (while the launcher still links it) and every member is killed, else orphaned ranks
    would run on and keep the output pipes open."""
    import psutil

    try:
        tree = [psutil.Process(p.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.Error:
        tree = []
    for proc in tree:
        try:
            proc.kill()
        except psutil.Error:
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)  # what the tree missed: a process started while it was listed
    except (ProcessLookupError, PermissionError):
        pass
    p.communicate()
