"""What this machine runs: library versions, devices, communication settings, cores, threads, ``/dev/shm``.

``versions()`` goes into every run summary; ``trainscale env`` prints everything for a bug report.

Example::

    trainscale env            # a table
    trainscale env --json     # one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import sys
from typing import Any

__all__ = ["versions", "machine", "main", "available_cores", "PACKAGE_DIR", "user_code"]

# Variables that change how NCCL, Gloo, CUDA and the thread pools behave: what a bug report needs.
__version__ = "0.1.0"  # the one place the version is written; the package and pyproject read it

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))  # trainscale's own code
_STDLIB = os.path.dirname(os.__file__)


def user_code(filename: str) -> bool:
    """Whether a frame's file is the user's: not trainscale's, the standard library's, an installed package's
    (``site-packages``, ``dist-packages``) or a frozen module's."""
    return not (filename.startswith(("<", PACKAGE_DIR, _STDLIB)) or "-packages" + os.sep in filename)


ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "CUDA_", "OMP_", "MKL_", "TRAINSCALE_")


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def versions() -> dict[str, str | None]:
    """trainscale, torch, Python, and CUDA / cuDNN / NCCL when torch was built with them (else null)."""
    import torch

    cuda = torch.version.cuda
    nccl = None
    if cuda and torch.distributed.is_available() and torch.distributed.is_nccl_available():
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    cudnn = torch.backends.cudnn.version() if cuda else None
    return {"trainscale": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "cuda": cuda, "cudnn": str(cudnn) if cudnn else None, "nccl": nccl}


def machine() -> dict[str, Any]:
    """Host, OS, cores, threads, devices, ``/dev/shm`` and the communication settings in the environment."""
    import torch


    shm = shutil.disk_usage("/dev/shm") if os.path.isdir("/dev/shm") else None
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    dist_ok = torch.distributed.is_available()
    return {
        "host": socket.gethostname(), "os": platform.platform(), "cpu_count": os.cpu_count(),
        "available_cores": available_cores(), "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(), "gpus": gpus,
        "backends": {"gloo": dist_ok and torch.distributed.is_gloo_available(),
                     "nccl": dist_ok and torch.distributed.is_nccl_available()},
        # DataLoader workers hand batches over through shared memory; a small /dev/shm (Docker's 64 MB) breaks them.
        "dev_shm_bytes": {"total": shm.total, "free": shm.free} if shm else None,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def main(argv: list[str]) -> int:
    """Entry of ``trainscale env``."""
    p = argparse.ArgumentParser(prog="trainscale env", description="Versions, devices, communication settings, "
                                "cores, threads and /dev/shm of this machine, for a bug report.")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = p.parse_args(argv)
    info = {"versions": versions(), **machine()}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    rows = [(k, v or "-") for k, v in info["versions"].items()]
    shm = info["dev_shm_bytes"]
    rows += [("host", info["host"]), ("os", info["os"]),
             ("cores", f"{info['available_cores']} available of {info['cpu_count']}"),
             ("torch threads", info["torch_threads"]),
             ("devices", ", ".join(info["gpus"]) or "cpu only (no CUDA device)"),
             ("backends", ", ".join(k for k, ok in info["backends"].items() if ok) or "none"),
             ("/dev/shm", f"{_human_bytes(shm['free'])} free of {_human_bytes(shm['total'])}" if shm else "absent")]
    rows += [(k, v) for k, v in info["env"].items()] or [("settings", "no NCCL_/GLOO_/CUDA_/OMP_ variables set")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
