"""Process groups, device and backend choice, the launcher and its environment table."""

from .env import DistEnv, default_threads, gather_env_rows, init_distributed, is_launched, shutdown
from .launcher import LaunchFailed, LaunchSpec, launch

__all__ = ["DistEnv", "init_distributed", "is_launched", "default_threads", "gather_env_rows", "shutdown",
           "LaunchSpec", "launch", "LaunchFailed"]
