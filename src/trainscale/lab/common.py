"""What bench and doctor share: option parsing helpers, atomic JSON, the rich console."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from ..config import Config, ConfigError

__all__ = ["parse_nproc_list", "check_train_args", "to_overrides", "write_json", "console", "err_console", "fmt",
           "machine_description", "cores"]

# Piped output (CI logs, subprocess capture) gets 120 columns instead of rich's 80, so tables do not wrap.
console = Console(width=None if sys.stdout.isatty() else 120)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)

_RESERVED = ("--json", "--nproc", "--log.progress", "--print-config", "--job.out")


def cores() -> int:
    """Cores the lab's runs may use (the one core-count helper, from the distributed layer)."""
    from ..distributed.env import available_cores
    return available_cores()


def machine_description() -> str:
    """Host, cores and GPUs, for the reports' header."""
    import platform
    try:
        import torch
        gpus = torch.cuda.device_count()
        dev = f"{gpus} x {torch.cuda.get_device_name(0)}" if gpus else "no GPU"
    except Exception:  # pragma: no cover - a broken CUDA install must not stop a report
        dev = "unknown accelerator"
    return f"{platform.node()}, {cores()} CPU cores, {dev}"


def parse_nproc_list(text: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]; anything else is one clear error."""
    accepted = "comma-separated process counts >= 1, e.g. 1,2,4"
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ConfigError("--nproc", text, accepted) from None
    if not values or any(v < 1 for v in values):
        raise ConfigError("--nproc", text, accepted)
    return sorted(set(values))


def check_train_args(args: list[str]) -> Config:
    """Validate the train options before any run starts (a typo fails now, not after minutes)."""
    from ..train.cli import parse

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
    from ..config import Config, config_to_dict
    from ..train.cli import parse

    _, cfg = parse(list(args))
    new, old = config_to_dict(cfg), config_to_dict(Config())
    steps_given = any(a.split("=", 1)[0] in ("--steps", "--job.steps") for a in args)
    out: list[str] = []
    for sec, fields in new.items():
        for k, v in fields.items():
            if v != old[sec][k] or (sec, k) == ("job", "steps") and steps_given:
                out += [f"--{sec}.{k}", str(v).lower() if isinstance(v, bool) else str(v)]
    return out


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically: a reader never sees half a file, a crash keeps the previous one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2, default=str) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fmt(v: Any, digits: int = 3) -> str:
    """Short human number."""
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)
