"""The doctor and bench on an unmodified training script (plain DDP, accelerate, Lightning, the Hugging Face
Trainer): trainscale enters each rank from outside, through a ``sitecustomize`` on ``PYTHONPATH``
(``site_dir``), reaches the step boundary, data wait, backward and every DDP instance through PyTorch's own
hooks, switches the same paired experiments as the run API and writes the same run summary.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["site_dir", "pythonpath", "ENABLE"]

ENABLE = "TRAINSCALE_INJECT"  # set to "1" in a run's environment: its ranks are instrumented


def site_dir() -> Path:
    """The folder to put first on ``PYTHONPATH``: its ``sitecustomize`` installs the agent in each rank."""
    return Path(__file__).resolve().parent / "site"


def pythonpath(existing: str = "") -> str:
    """``PYTHONPATH`` for an instrumented run: the site folder first, then this trainscale, then ``existing``."""
    import os

    package_root = Path(__file__).resolve().parents[2]  # the folder holding trainscale: ranks import this copy
    return os.pathsep.join(p for p in (str(site_dir()), str(package_root), existing) if p)
