"""Fully sharded data parallelism on FSDP2 (``fully_shard``): units, precision, offload, and the bytes they move.

Each unit (a block, ``strategy.fsdp_modules``) is sharded first, then the root with what is left, as torchtitan
does. In forward each unit's parameters are all-gathered just before it runs and freed after it
(``reshard_after_forward``); in backward they are gathered again and the unit's gradients reduce-scattered as
soon as they are complete, so communication overlaps compute unit by unit. Every rank keeps 1/W of the
parameters, gradients and optimizer state.

Bytes one rank sends per optimizer step (ring volumes, ``sim.collectives``), with W ranks, A micro-steps
(``strategy.grad_accum``) and, for each unit u, N_u its parameters' elements padded as FSDP2 pads them (dim 0
rounded up to a multiple of W)::

    all_gather     = A * sum_u g_u * N_u * s_param  * (W-1)/W    g_u = 2 with reshard_after_forward, 1 without
                                                                   (and 1 for the root, which keeps them to backward)
    reduce_scatter =     sum_u       N_u * s_reduce * (W-1)/W    once per optimizer step (no sync before the last)

``s_param`` and ``s_reduce``: bytes per element of ``fsdp_param_dtype`` and ``fsdp_reduce_dtype``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from torch import nn

from ..config import ConfigError, StrategyConfig
from ..costs.collectives import collective_bytes
from ..distributed import DistEnv
from .layers import _flatten

__all__ = ["FsdpState", "apply_fsdp", "shard_units", "checkpoint_units", "unit_bytes"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_ROOT = ""


def _has_params(m: nn.Module) -> bool:
    return any(True for _ in m.parameters())


def _auto_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's own blocks: its ``pipeline_layers()`` that are submodules, a Sequential's layers, ModuleList entries."""
    name_of = {id(m): n for n, m in model.named_modules() if m is not model}
    if hasattr(model, "pipeline_layers"):
        found = [m for _, m in cast(Any, model).pipeline_layers()]
    elif isinstance(model, nn.Sequential):
        found = [m for _, m in _flatten(model, "")]
    else:
        found = [c for m in model.modules() if isinstance(m, nn.ModuleList) for c in m]
    return [(name_of[id(m)], m) for m in found if id(m) in name_of and _has_params(m)]


def shard_units(model: nn.Module, spec: str) -> list[tuple[str, nn.Module]]:
    """The submodules sharded as units, in the model's order: ``spec`` names classes or modules; empty: its blocks.

    A name that matches no module is refused with the model's module classes, so a typo fails at start.
    """
    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    if not tokens:
        return _auto_units(model)
    named = [(n, m) for n, m in model.named_modules() if m is not model]
    for tok in tokens:
        if not any(n == tok or type(m).__name__ == tok for n, m in named):
            classes = sorted({type(m).__name__ for _, m in named if _has_params(m)})
            raise ConfigError("strategy.fsdp_modules", spec, f"no module of class or name {tok!r} in "
                              f"{type(model).__name__}; its classes with parameters: {', '.join(classes[:12])}")
    return [(n, m) for n, m in named if (n in tokens or type(m).__name__ in tokens) and _has_params(m)]


def _outermost(units: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    names = [n for n, _ in units]
    return [(n, m) for n, m in units if not any(n.startswith(o + ".") for o in names)]


def checkpoint_units(units: list[tuple[str, nn.Module]]) -> int:
    """Recompute each outermost unit's activations in backward (``torch.utils.checkpoint``); returns how many.

    The unit's ``forward`` is replaced on the instance, not wrapped in a new module: parameter names, and so
    checkpoints, stay those of the model without activation checkpointing.
    """
    import torch.utils.checkpoint as ckpt

    outer = _outermost(units)
    for _, m in outer:
        def forward(*args: Any, _f: Callable[..., Any] = m.forward, **kw: Any) -> Any:
            # Non-reentrant: keyword arguments, inputs that need no gradient, and FSDP's hooks all work.
            return ckpt.checkpoint(_f, *args, use_reentrant=False, **kw)
        m.forward = forward
    return len(outer)


def _padded_numel(p: torch.Tensor, world: int) -> int:
    """Elements FSDP2 all-gathers for ``p``: dim 0 rounded up to a multiple of the world (equal shards)."""
    if p.dim() == 0:
        return world
    return math.ceil(p.shape[0] / world) * world * (p.numel() // max(1, p.shape[0]))


def unit_bytes(model: nn.Module, units: list[tuple[str, nn.Module]], world: int) -> dict[str, int]:
    """Padded elements of the parameters each unit manages (its own, not a nested unit's); ``""``: the root."""
    names = sorted((n for n, _ in units), key=len, reverse=True)  # the deepest unit owns a parameter
    out = {n: 0 for n in [_ROOT, *names]}
    for pname, p in model.named_parameters():
        owner = next((u for u in names if pname.startswith(u + ".")), _ROOT)
        out[owner] += _padded_numel(p, world)
    return out


class FsdpState:
    """What the FSDP strategy keeps: the root, its units, the step's byte counts, the gradient-sync flag.

    Example::

        fsdp = apply_fsdp(model, env, cfg.strategy)
        fsdp.set_sync(last_micro_step)     # reduce-scatter in this backward, or accumulate unsharded
    """

    __slots__ = ("root", "units", "cfg", "world", "sync", "allgather_bytes", "reduce_scatter_bytes",
                 "checkpointed",
                 # internal
                 "_old_names")

    def __init__(self, root: nn.Module, units: list[nn.Module], cfg: StrategyConfig, world: int,
                 old_names: dict[int, str]):
        self.root, self.units, self.cfg, self.world = root, units, cfg, world
        self.sync = True
        self.allgather_bytes = self.reduce_scatter_bytes = 0.0  # per optimizer step, sent by this rank
        self.checkpointed = 0  # units whose activations are recomputed
        self._old_names = old_names  # id of each parameter before sharding -> its name, until the optimizer is rebound

    def set_sync(self, sync: bool) -> None:
        """Whether the next backward reduce-scatters gradients (False: they accumulate unsharded, FSDP's no_sync)."""
        if sync != self.sync:
            self.root.set_requires_gradient_sync(sync)  # type: ignore[operator]
            self.sync = sync

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside accumulates gradients unsharded, without a reduce-scatter (DDP's ``no_sync``)."""
        before = self.sync
        self.set_sync(False)
        try:
            yield
        finally:
            self.set_sync(before)

    def rebind_optimizer(self, opt: torch.optim.Optimizer | None) -> None:
        """Point ``opt`` at the sharded parameters: fully_shard replaced the ones it was built on (same names)."""
        old, self._old_names = self._old_names, {}
        if opt is None:
            return
        if any(opt.state.values()):
            raise ValueError("under strategy.fsdp the optimizer must not have stepped before run.prepare(): its "
                             "state belongs to the unsharded parameters")
        new = dict(self.root.named_parameters())
        ids = {id(p) for p in new.values()}
        for g in opt.param_groups:
            g["params"] = [p if id(p) in ids else new[old[id(p)]] for p in g["params"]]

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Inside: every unit's parameters stay all-gathered, so forwards make no collective (uneven evaluation)."""
        mods = [*self.units, self.root]
        for m in mods:
            m.set_reshard_after_forward(False, recurse=False)  # type: ignore[operator]
        for m in mods:
            m.unshard()  # type: ignore[operator]  # collective: every rank enters evaluation together
        try:
            yield
        finally:
            for m in mods:
                m.reshard()  # type: ignore[operator]
            for m in self.units:
                m.set_reshard_after_forward(self.cfg.reshard_after_forward, recurse=False)  # type: ignore[operator]

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state as plain tensors (collective: each sharded tensor is all-gathered)."""
        return {k: _full(v) for k, v in self.root.state_dict().items()}

    def load_full_state_dict(self, state: dict[str, Any]) -> None:
        """Load a whole-model state (a DDP or one-process checkpoint): each rank keeps its shard."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        set_model_state_dict(self.root, dict(state), options=StateDictOptions(full_state_dict=True))

    def full_optimizer_state(self, opt: torch.optim.Optimizer) -> dict[str, Any]:
        """``opt.state_dict()`` with every sharded tensor all-gathered: loadable by a plain optimizer (collective)."""
        sd = opt.state_dict()
        sd["state"] = {i: {k: _full(v) for k, v in s.items()} for i, s in sd["state"].items()}
        return sd

    def shard_optimizer_state(self, opt: torch.optim.Optimizer) -> None:
        """After ``opt.load_state_dict`` of a whole-model state: keep each rank's shard of every full tensor."""
        from torch.distributed.tensor import DTensor, distribute_tensor
        for p, s in opt.state.items():
            if not isinstance(p, DTensor):
                continue
            for k, v in s.items():
                if torch.is_tensor(v) and not isinstance(v, DTensor) and v.shape == p.shape:
                    # Every rank read the same file: each cuts its own shard, nothing is sent.
                    s[k] = distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)

    def report(self) -> dict[str, Any]:
        """The ``fsdp`` object of the run summary."""
        c = self.cfg
        return {"units": len(self.units), "allgather_bytes_per_step": self.allgather_bytes,
                "reduce_scatter_bytes_per_step": self.reduce_scatter_bytes,
                "reshard_after_forward": c.reshard_after_forward, "param_dtype": c.fsdp_param_dtype,
                "reduce_dtype": c.fsdp_reduce_dtype, "cpu_offload": c.fsdp_cpu_offload,
                "activation_checkpointing": self.checkpointed}


def _full(v: Any) -> Any:
    return v.full_tensor() if hasattr(v, "full_tensor") else v  # a DTensor shard: all-gathered (collective)


def _count_bytes(state: FsdpState, sizes: dict[str, int], cfg: StrategyConfig) -> None:
    """The module docstring's formula, from the padded unit sizes."""
    w, s_param = state.world, _DTYPES[cfg.fsdp_param_dtype].itemsize
    s_reduce = _DTYPES[cfg.fsdp_reduce_dtype].itemsize
    gathers = sum((1 + (cfg.reshard_after_forward and u != _ROOT)) * n for u, n in sizes.items())
    state.allgather_bytes = cfg.grad_accum * collective_bytes("all_gather", gathers * s_param, w)
    state.reduce_scatter_bytes = collective_bytes("reduce_scatter", sum(sizes.values()) * s_reduce, w)


def apply_fsdp(model: nn.Module, env: DistEnv, cfg: StrategyConfig) -> FsdpState:
    """Shard ``model`` in place: each unit with ``fully_shard``, then the root; activation checkpointing if asked.

    Example::

        fsdp = apply_fsdp(model, env, cfg.strategy)   # model's parameters are now DTensor shards
        fsdp.rebind_optimizer(optimizer)              # built on the unsharded ones
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if cfg.fsdp_cpu_offload and env.device.type != "cuda":
        raise ConfigError("strategy.fsdp_cpu_offload", True, "moves sharded state from the GPU to host memory; on "
                          f"a {env.device.type} device it is there already; set false")
    units = shard_units(model, cfg.fsdp_modules)
    sizes = unit_bytes(model, units, env.world_size)
    old_names = {id(p): n for n, p in model.named_parameters()}
    param_dtype = _DTYPES[cfg.fsdp_param_dtype] if cfg.fsdp_param_dtype != "fp32" else None
    reduce_dtype = _DTYPES[cfg.fsdp_reduce_dtype] if cfg.fsdp_reduce_dtype != "fp32" or param_dtype else None
    kw: dict[str, Any] = {"mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
                          "offload_policy": CPUOffloadPolicy() if cfg.fsdp_cpu_offload else OffloadPolicy()}
    checkpointed = checkpoint_units(units) if cfg.activation_checkpointing else 0
    order = {id(m): i for i, m in enumerate(model.modules())}
    for _, m in sorted(units, key=lambda u: -order[id(u[1])]):  # innermost first: a parent holds what is left
        fully_shard(m, reshard_after_forward=cfg.reshard_after_forward, **kw)
    # The root: None lets FSDP keep its parameters from forward to backward (freed, they would be gathered at once).
    fully_shard(model, reshard_after_forward=None if cfg.reshard_after_forward else False, **kw)
    state = FsdpState(model, [m for _, m in units], cfg, env.world_size, old_names)
    state.checkpointed = checkpointed
    _count_bytes(state, sizes, cfg)
    return state
