"""Process groups, device and backend choice, the launcher and its environment table.

Names are imported on first use: ``trainscale launch`` checks its input before anything imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"DistEnv": "env", "init_distributed": "env", "is_launched": "env", "default_threads": "env",
          "gather_env_rows": "env", "shutdown": "env", "LaunchSpec": "launcher", "launch": "launcher",
          "LaunchFailed": "launcher"}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
