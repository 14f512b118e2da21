"""Refuse strategy combinations that cannot work, at start, with one line naming the field and the reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config import ConfigError, StrategyConfig

__all__ = ["check_strategy", "check_transport", "needs_hook", "node_size"]


def needs_hook(cfg: StrategyConfig) -> bool:
    """True when gradients go through a DDP communication hook instead of DDP's built-in all-reduce."""
    return (cfg.hierarchical or cfg.compression != "none" or cfg.comm_groups > 1 or cfg.local_sgd_period > 0)


def node_size(cfg: StrategyConfig, world: int, local_world: int) -> int:
    """Processes per node: ``strategy.local_size`` when set, else the launcher's LOCAL_WORLD_SIZE."""
    return cfg.local_size or max(1, min(local_world, world))


def check_transport(cfg: StrategyConfig, device: str, backend: str) -> None:
    """Refuse a pipeline whose stages would send CUDA tensors through Gloo.

    Pipeline stages pass activations and their gradients with send/recv. Gloo's send hands the tensor's memory
    to the socket as it is, so from CUDA memory the first send fails ("writev ... Bad address") and the job dies
    on its first step; its collectives (all-reduce, broadcast) copy through the host and work, its send/recv
    does not. Processes that share a GPU get Gloo (NCCL refuses two ranks on one GPU), so such a job cannot
    pipeline on CUDA.
    """
    if cfg.pipeline_stages > 1 and device == "cuda" and backend == "gloo":
        raise ConfigError("strategy.pipeline_stages", cfg.pipeline_stages,
                          "pipeline stages send activations with send/recv, which the gloo backend cannot do from "
                          "CUDA memory; give each process a GPU of its own (nccl), or use --job.device cpu")


def check_strategy(cfg: StrategyConfig, world: int | None = None, local_world: int | None = None) -> None:
    """Raise ConfigError for a combination that cannot work (world-dependent checks when ``world`` is given)."""
    s = cfg
    if s.fsdp:
        _check_fsdp(s)
    elif s.fsdp_param_dtype != "fp32" or s.fsdp_reduce_dtype != "fp32" or s.fsdp_cpu_offload:
        what = "fsdp_cpu_offload" if s.fsdp_cpu_offload else \
            "fsdp_param_dtype" if s.fsdp_param_dtype != "fp32" else "fsdp_reduce_dtype"
        raise ConfigError(f"strategy.{what}", getattr(s, what), "applies to FSDP only; set strategy.fsdp true "
                          "(or strategy.amp for DDP)")
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


# FSDP's gradients leave backward reduce-scattered into shards: what works through DDP's reducer, its comm hooks or a
# whole-model replica cannot apply. Each: field, whether its value is refused, why, what to do instead.
_NOT_WITH_FSDP: tuple[tuple[str, Callable[[Any], bool], str, str], ...] = (
    ("local_sgd_period", lambda v: v > 0, "local SGD averages whole replicas, which FSDP does not keep", "set 0"),
    ("compression", lambda v: v != "none", "compression is a DDP communication hook; FSDP reduce-scatters itself",
     "use none, or strategy.fsdp_reduce_dtype bf16"),
    ("hierarchical", bool, "hierarchical all-reduce is a DDP communication hook", "set false"),
    ("comm_groups", lambda v: v > 1, "several communicators are a DDP communication hook", "set 1"),
    ("shard_optimizer", bool, "FSDP shards the optimizer state already", "set false"),
    ("pipeline_stages", lambda v: v > 1, "pipeline stages run DDP inside each stage", "set 1"),
    ("overlap", lambda v: not v, "FSDP reduce-scatters in backward, there is no exchange after it", "set true"),
    ("bucket_mb", lambda v: v == "auto", "FSDP makes one collective per unit, there are no buckets to tune",
     "give a size in MB"),
    ("amp", lambda v: v == "fp16", "fp16's loss scaler would see an overflow on one rank's shard only",
     "use bf16, or strategy.fsdp_param_dtype bf16"),
)


def _check_fsdp(s: StrategyConfig) -> None:
    """FSDP with a strategy that needs DDP or whole replicas: one line naming the field."""
    for key, refused, why, instead in _NOT_WITH_FSDP:
        value = getattr(s, key)
        if refused(value):
            raise ConfigError(f"strategy.{key}", value, f"not with strategy.fsdp true ({why}); {instead}")
