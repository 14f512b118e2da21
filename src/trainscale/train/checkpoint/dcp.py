"""Sharded checkpoints on ``torch.distributed.checkpoint`` (DCP): every rank writes its part, any world size loads.

The state is flat and holds tensors only, so loading unpickles nothing: ``model/NAME`` (the same on every
rank: DCP writes it once), ``optim/PARAM/KEY`` (each rank the state it holds; under ZeRO its own partition,
so nothing is gathered), ``rng/RANK/...`` and ``meta`` (step, loader, scaler and strategy counters as JSON
bytes in a uint8 tensor). At another world size each rank reads the parameters' optimizer state of its new
partition by name (DCP's resharding) and the RNG of its rank where one was saved. Under FSDP the model's and the
optimizer's tensors are DTensor shards: each rank writes its shard and reads its new one, and a whole-tensor
(DDP) checkpoint loads into shards and a sharded one into whole tensors, since DCP keys both by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor

from ...config import ConfigError
from .files import rng_state, set_rng_state

__all__ = ["dcp_save", "dcp_load", "read_meta", "read_all", "param_names", "rng_tensors", "rng_from_tensors", "meta_tensor"]


def _local_optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    return getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps this rank's partition in .optim


def _param_names(module: nn.Module) -> dict[int, str]:
    return {id(p): n for n, p in module.named_parameters()}


def param_names(module: nn.Module, opt: torch.optim.Optimizer) -> list[list[str]]:
    """The names of each optimizer group's parameters, in order: what maps an optimizer state_dict's indices to
    DCP's ``optim/NAME/KEY`` (a model's state_dict alone cannot tell parameters from buffers)."""
    names = _param_names(module)
    return [[names[id(p)] for p in g["params"]] for g in opt.param_groups]


def rng_tensors(state: dict[str, Any], rank: int) -> dict[str, torch.Tensor]:
    """``checkpoint.rng_state()``'s dict as the flat tensors of rank ``rank`` (CUDA states are not kept)."""
    py = state["python"]
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    return {f"rng/{rank}/torch": state["torch"],
            f"rng/{rank}/python": torch.tensor([py[0], *py[1], py[2] if py[2] is not None else -1], dtype=torch.int64),
            f"rng/{rank}/numpy": torch.as_tensor(keys, dtype=torch.int64),
            f"rng/{rank}/numpy_rest": torch.tensor([pos, has_gauss, gauss], dtype=torch.float64)}


def rng_from_tensors(t: dict[str, torch.Tensor], rank: int) -> dict[str, Any]:
    """The inverse of :func:`rng_tensors`: a dict that ``checkpoint.set_rng_state`` restores."""
    py = t[f"rng/{rank}/python"].tolist()
    pos, has_gauss, gauss = t[f"rng/{rank}/numpy_rest"].tolist()
    return {"torch": t[f"rng/{rank}/torch"], "python": (py[0], tuple(py[1:-1]), None if py[-1] == -1 else py[-1]),
            "numpy": ("MT19937", t[f"rng/{rank}/numpy"], int(pos), int(has_gauss), gauss)}


def meta_tensor(meta: dict[str, Any]) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(meta).encode()), dtype=torch.uint8).clone()


def build_state(module: nn.Module, opt: torch.optim.Optimizer | None, meta: dict[str, Any],
                rank: int) -> dict[str, Any]:
    """This rank's flat DCP state (tensors only)."""
    state: dict[str, Any] = {f"model/{k}": v for k, v in module.state_dict().items()}
    if opt is not None:
        names, local = _param_names(module), _local_optimizer(opt)
        for p, s in local.state.items():
            for k, v in s.items():
                state[f"optim/{names[id(p)]}/{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
        meta = {**meta, "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]}
    state["meta"] = meta_tensor(meta)
    state.update(rng_tensors(rng_state(), rank))
    return state


def dcp_save(path: Path, module: nn.Module, opt: torch.optim.Optimizer | None, meta: dict[str, Any], rank: int,
             group: Any = None, asynchronous: bool = False) -> Any:
    """Collective: write this rank's shard of the checkpoint folder ``path`` (``.metadata`` last, by the coordinator).

    ``asynchronous``: the state is staged in host memory, then written by a background thread; the
    returned future (``async_save``'s) completes when the folder is complete on this rank; None when synchronous.
    """
    state = build_state(module, opt, meta, rank)
    if asynchronous:
        return dcp.async_save(state, checkpoint_id=str(path), process_group=group)
    dcp.save(state, checkpoint_id=str(path), process_group=group)
    return None


def read_meta(path: Path) -> dict[str, Any]:
    """The JSON metadata of a DCP checkpoint (step, world size ...), read without a process group."""
    return json.loads(_read_tensors(path, ["meta"])["meta"].numpy().tobytes().decode())


def _empty_like_saved(meta: Any, like: Any = None) -> torch.Tensor:
    """An empty tensor of a saved entry's shape and dtype (every entry trainscale writes is a tensor).

    ``like``: the tensor it will be loaded into; a DTensor (FSDP) of that shape gets an empty shard of its own
    layout, so DCP reads only this rank's part.
    """
    if isinstance(like, DTensor) and tuple(like.shape) == tuple(meta.size):
        return torch.empty_like(like, dtype=meta.properties.dtype)
    return torch.empty(meta.size, dtype=meta.properties.dtype)


def _read_tensors(path: Path, keys: list[str] | None = None) -> dict[str, torch.Tensor]:
    md = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    out = {k: _empty_like_saved(md[k]) for k in (md if keys is None else keys) if k in md}
    dcp.load(out, checkpoint_id=str(path), no_dist=True)
    return out


def read_all(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a trainscale DCP folder, without a process group (what DCP's dcp_to_torch_save reads)."""
    return _read_tensors(path)


def dcp_load(path: Path, module: nn.Module, opt: torch.optim.Optimizer | None, rank: int,
             group: Any = None) -> dict[str, Any]:
    """Load the folder ``path`` at this world size: model, this rank's optimizer partition, RNG; returns the meta."""
    try:
        md = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception as e:
        raise ConfigError("--resume", str(path), f"not a readable sharded checkpoint: {e}") from None
    if "meta" not in md:
        raise ConfigError("--resume", str(path), "not a trainscale checkpoint (no meta)")
    want = [k for k in md if k.startswith("model/") or k == "meta" or k.startswith(f"rng/{rank}/")]
    names, local = _param_names(module), _local_optimizer(opt) if opt is not None else None
    mine: dict[str, torch.nn.Parameter] = {}
    if local is not None:
        for g in local.param_groups:
            for p in g["params"]:
                mine[names[id(p)]] = p
        want += [k for k in md if k.startswith("optim/") and k.split("/")[1] in mine]
    own = module.state_dict()
    likes = {k: own.get(k[len("model/"):]) if k.startswith("model/") else
             mine.get(k.split("/")[1]) if k.startswith("optim/") else None for k in want}
    state = {k: _empty_like_saved(md[k], likes[k]) for k in want}
    kw = {"no_dist": True} if not (dist.is_available() and dist.is_initialized()) else {"process_group": group}
    dcp.load(state, checkpoint_id=str(path), **kw)
    module.load_state_dict({k[len("model/"):]: v for k, v in state.items() if k.startswith("model/")})
    meta = json.loads(state["meta"].numpy().tobytes().decode())
    if local is not None:
        local.state.clear()
        for k, v in state.items():
            if k.startswith("optim/"):
                _, name, key = k.split("/", 2)
                local.state[mine[name]][key] = v.to(mine[name].device) if v.dim() else v
        assert opt is not None  # local is opt's own (or its ZeRO shard's) optimizer
        for g, saved in zip(opt.param_groups, meta.get("param_groups", [])):
            g.update(saved)
        if local is not opt:
            for g, saved in zip(local.param_groups, meta.get("param_groups", [])):
                g.update(saved)
    if f"rng/{rank}/torch" in state:
        set_rng_state(rng_from_tensors(state, rank))
    meta["rng_restored"] = f"rng/{rank}/torch" in state
    return meta
