"""Refuse strategy combinations that cannot work, at start, with one line naming the field and the reason."""

from __future__ import annotations

from ..config import ConfigError, StrategyConfig

__all__ = ["check_strategy", "needs_hook", "node_size"]


def needs_hook(cfg: StrategyConfig) -> bool:
    """True when gradients go through a DDP communication hook instead of DDP's built-in all-reduce."""
    return (cfg.hierarchical or cfg.compression != "none" or cfg.comm_groups > 1 or cfg.local_sgd_period > 0)


def node_size(cfg: StrategyConfig, world: int, local_world: int) -> int:
    """Processes per node: ``strategy.local_size`` when set, else the launcher's LOCAL_WORLD_SIZE."""
    return cfg.local_size or max(1, min(local_world, world))


def check_strategy(cfg: StrategyConfig, world: int | None = None, local_world: int | None = None) -> None:
    """Raise ConfigError for a combination that cannot work (world-dependent checks when ``world`` is given)."""
    s = cfg
    if not s.overlap and needs_hook(s):
        what = ("hierarchical" if s.hierarchical else "compression" if s.compression != "none"
                else "comm_groups" if s.comm_groups > 1 else "local_sgd_period")
        raise ConfigError(f"strategy.{what}", getattr(s, what),
                          "works through a DDP communication hook, which strategy.overlap false bypasses "
                          "(gradients are then all-reduced after backward); set strategy.overlap true")
    if s.compression == "powersgd" and s.hierarchical:
        raise ConfigError("strategy.compression", s.compression,
                          "powersgd runs its own all-reduces over one group and cannot be hierarchical; "
                          "use fp16 or bf16 with strategy.hierarchical")
    if s.compression == "powersgd" and s.comm_groups > 1:
        raise ConfigError("strategy.comm_groups", s.comm_groups, "powersgd uses one process group; set 1")
    if s.local_sgd_period:
        if s.compression != "none":
            raise ConfigError("strategy.compression", s.compression,
                              "local SGD exchanges no gradients after its warm-up; use compression none")
        if s.comm_groups > 1:
            raise ConfigError("strategy.comm_groups", s.comm_groups, "local SGD exchanges no gradients; set 1")
        if s.shard_optimizer:
            raise ConfigError("strategy.shard_optimizer", True,
                              "each local SGD replica needs its whole optimizer state; set false")
        if s.bucket_mb == "auto":
            raise ConfigError("strategy.bucket_mb", "auto",
                              "local SGD turns the gradient all-reduce off, so there is nothing to tune; give MB")
    if world is None:
        return
    if world % s.pipeline_stages:
        raise ConfigError("strategy.pipeline_stages", s.pipeline_stages,
                          f"must divide the world size {world} (the world is replicas x stages)")
    if s.local_size and world % s.local_size:
        raise ConfigError("strategy.local_size", s.local_size,
                          f"must divide the world size {world} (nodes of equal size)")
    if s.local_size > world:
        raise ConfigError("strategy.local_size", s.local_size, f"must be <= the world size {world}")
    if s.hierarchical and local_world is not None and world % node_size(s, world, local_world):
        raise ConfigError("strategy.hierarchical", True,
                          f"the world size {world} is not a multiple of the processes per node "
                          f"{node_size(s, world, local_world)}; set strategy.local_size")
