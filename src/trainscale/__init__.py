"""trainscale: scale PyTorch training across devices and machines, and measure why it does not scale."""

from .about import __version__
from .config import Config, ConfigError, load_config

__all__ = ["__version__", "Config", "ConfigError", "load_config", "init", "Run", "Trainer", "prepare"]


def __getattr__(name: str):
    # The run API pulls in torch.distributed; import it only when asked so `trainscale --help` stays fast.
    if name in ("init", "Run", "RunError"):
        from .train import run
        return getattr(run, name)
    if name in ("Trainer", "prepare"):
        from .train import trainer
        return getattr(trainer, name)
    raise AttributeError(name)
