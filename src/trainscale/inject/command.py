"""A training command as its user runs it, read so that trainscale can own its launch at 1 and N processes.

``python train.py ...``, ``torchrun --nproc-per-node K train.py ...`` (or ``python -m torch.distributed.run``),
``accelerate launch --num_processes K train.py ...``: the launcher's own options are kept as the launch
settings (the report records them), the process count is what trainscale rewrites, and what remains is the
script with its arguments. A script that imports trainscale is on the run API; any other is instrumented from
outside (``uses_run_api``). Anything that is not a Python script is refused with one line.

Example::

    cmd = parse_command(["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "0.1"])
    cmd.script, cmd.nproc, cmd.launcher        # ["train.py", "--lr", "0.1"], 2, "torchrun"
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

__all__ = ["UserCommand", "parse_command", "uses_run_api", "ACCEPTED"]

ACCEPTED = ("a Python training run after --: [python] train.py [args], torchrun --nproc-per-node K train.py [args], "
            "or accelerate launch --num_processes K train.py [args]")
# Launcher options that take no value (every other option takes one).
_FLAGS = {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path",
          "--multi_gpu", "--multi-gpu", "--cpu", "--use_cpu", "--debug", "--quiet", "-q", "--tee-all",
          "--use_deepspeed", "--use_fsdp", "--use_megatron_lm", "--use_xpu", "--dynamo_use_fullgraph",
          "--dynamo_use_dynamic", "--same_network", "--machine_type"}
_NPROC = {"torchrun": ("--nproc-per-node", "--nproc_per_node"),
          "accelerate": ("--num_processes", "--num-processes")}


@dataclass
class UserCommand:
    """The user's command: its launcher (python, torchrun, accelerate), that launcher's settings, the process
    count it asked for (None: one), and the script with its arguments (``["-m", "pkg.mod", ...]`` for a module)."""

    launcher: str
    script: list[str]
    nproc: int | None = None
    options: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """The launch settings in one phrase, for the report."""
        opts = " ".join(self.options)
        return f"{self.launcher}{' ' + opts if opts else ''} ({self.nproc or 1} process(es) as given)"


def parse_command(argv: list[str]) -> UserCommand:
    """Read ``argv`` (what followed ``--``); one ``ConfigError`` line when it is not a Python training run."""
    text = " ".join(argv) or "(nothing)"
    if not argv:
        raise ConfigError("--", text, ACCEPTED)
    head, rest = Path(argv[0]).name, argv[1:]
    if re.fullmatch(r"python[0-9.]*", head):
        if rest[:2] == ["-m", "torch.distributed.run"] or rest[:2] == ["-m", "torch.distributed.launch"]:
            return _launcher("torchrun", rest[2:], text)
        return _script("python", _interpreter_options(rest), text)
    if head == "torchrun":
        return _launcher("torchrun", rest, text)
    if head == "accelerate" and rest[:1] == ["launch"]:
        return _launcher("accelerate", rest[1:], text)
    return _script("python", argv, text)


def _interpreter_options(argv: list[str]) -> list[str]:
    """The interpreter's own switches (``-u``, ``-O``...) dropped: what remains starts with the script or -m."""
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        i += 1
    return argv[i:]


def _launcher(name: str, argv: list[str], text: str) -> UserCommand:
    """A launcher's options up to the script: its process count read, the rest kept as launch settings."""
    options: list[str] = []
    nproc: int | None = None
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "--module"):
        key, eq, value = argv[i].partition("=")
        takes = not eq and key not in _FLAGS
        if takes and i + 1 >= len(argv):
            raise ConfigError(key, text, f"a value after {key}; {ACCEPTED}")
        val = value if eq else argv[i + 1] if takes else ""
        if key in _NPROC[name]:
            if not val.isdigit() or int(val) < 1:
                raise ConfigError(key, val, "a process count >= 1 (trainscale runs 1 and N itself)")
            nproc = int(val)
        else:
            options += [argv[i]] + ([val] if takes else [])
        i += 2 if takes else 1
    module = i < len(argv) and argv[i] in ("-m", "--module")
    cmd = _script(name, (["-m"] if module else []) + argv[i + module:], text)
    cmd.nproc, cmd.options = nproc, options
    return cmd


def _script(launcher: str, argv: list[str], text: str) -> UserCommand:
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        raise ConfigError("--", text, ACCEPTED)
    if argv[0] != "-m":
        path = Path(argv[0])
        if path.suffix != ".py" and not _python_source(path):
            raise ConfigError("--", text, f"not a Python training run: {argv[0]!r} is not a Python script; {ACCEPTED}")
        if not path.is_file():
            raise ConfigError("script", argv[0], "no such file (give the path of your training script)")
    return UserCommand(launcher, list(argv))


def _python_source(path: Path) -> bool:
    """A script without the .py suffix whose first line names Python."""
    try:
        with path.open("rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def uses_run_api(script: list[str]) -> bool:
    """Whether the script is on trainscale's run API (it imports trainscale); a module (-m) is taken to be."""
    if not script or script[0] == "-m":
        return True
    try:
        source = Path(script[0]).read_text(errors="replace")
    except OSError:
        return True
    return re.search(r"^\s*(import trainscale|from trainscale)", source, re.MULTILINE) is not None
