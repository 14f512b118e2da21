"""FSDP2 in an unmodified script: each ``fully_shard`` call seen, and what its units exchange per step.

FSDP gathers each unit's parameters in forward (and again in backward when it reshards after forward) and
reduce-scatters its gradients, so no step runs without its exchange: ``no_comm`` cannot take it out. The doctor
measures it instead, as the run API does under FSDP (``lab.terms.measured_exchange``): on CPU the training
thread's time blocked outside its data wait is its wait in the collectives (``GradMeter.blocked_is_exposed``).

``fully_shard`` is wrapped where a script imports it from (``torch.distributed.fsdp``, its ``_fully_shard``
module, and the older ``torch.distributed._composable.fsdp``) before the script's own import, so each call is
seen with its module and options. The summary's ``fsdp`` object is the run API's (``summary.schema.json``).
"""

from __future__ import annotations

import functools
from typing import Any

from ..costs.collectives import collective_bytes

__all__ = ["FSDP_MODULES", "install_fsdp", "fsdp_facts"]

FSDP_MODULES = ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard",
                "torch.distributed._composable.fsdp")
_NAMES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def install_fsdp(torch: Any, agent: Any) -> str:
    """Wrap ``fully_shard`` (now, or once its module is imported) to note each unit in ``agent.fsdp_units``."""
    if not hasattr(torch, "distributed") or not torch.distributed.is_available():
        return "not measured: this PyTorch has no torch.distributed"
    from .hooks import after_import

    for name in FSDP_MODULES:
        after_import(name, functools.partial(_wrap, units=agent.fsdp_units))
    return "measured"


def _wrap(module: Any, units: list[dict[str, Any]]) -> None:
    original = getattr(module, "fully_shard", None)
    if original is None or getattr(original, "__wrapped_by_trainscale__", False):
        return

    @functools.wraps(original)
    def fully_shard(target: Any, *args: Any, **kwargs: Any) -> Any:
        mods = list(target) if isinstance(target, (list, tuple)) else [target]
        inside = {id(m) for t in mods for m in t.modules()}
        params = [p for m in mods for p in m.parameters()]
        # A unit owns its parameters less those of the units sharded inside it before it (each element once).
        below = sum(u["elements"] for u in units if any(id(m) in inside for m in u["modules"]))
        mp, offload = kwargs.get("mp_policy"), kwargs.get("offload_policy")
        units.append({"modules": mods, "elements": sum(p.numel() for p in params) - below,
                      "itemsize": params[0].element_size() if params else 4,
                      "reshard": kwargs.get("reshard_after_forward", True) is not False,
                      "param_dtype": getattr(mp, "param_dtype", None),
                      "reduce_dtype": getattr(mp, "reduce_dtype", None),
                      "offload": type(offload).__name__ == "CPUOffloadPolicy"})
        return original(target, *args, **kwargs)

    fully_shard.__wrapped_by_trainscale__ = True  # type: ignore[attr-defined]
    module.fully_shard = fully_shard


def fsdp_facts(units: list[dict[str, Any]], world: int, micro: float) -> dict[str, Any]:
    """The summary's ``fsdp`` object from the units seen: bytes one rank sends per optimizer step (ring volumes,
    as ``strategies.fsdp`` counts them; shards not padded), ``micro`` micro-batches a step."""
    root = units[-1]  # the model, sharded last, as FSDP2's documentation and torchtitan do
    gathers = sum((1 + (u["reshard"] and u is not root)) * u["elements"] * _size(u, "param_dtype") for u in units)
    reduced = sum(u["elements"] * _size(u, "reduce_dtype") for u in units)
    return {"units": len(units) - 1,
            "allgather_bytes_per_step": max(1.0, micro) * collective_bytes("all_gather", gathers, world),
            "reduce_scatter_bytes_per_step": collective_bytes("reduce_scatter", reduced, world),
            "reshard_after_forward": all(u["reshard"] for u in units[:-1]),
            "param_dtype": _name(root["param_dtype"]),
            "reduce_dtype": _name(root["reduce_dtype"] or root["param_dtype"]),
            "cpu_offload": any(u["offload"] for u in units)}


def _size(unit: dict[str, Any], key: str) -> int:
    """Bytes per element a unit's collective moves: its policy's dtype, else the parameters' own."""
    dtype = unit[key] or (unit["param_dtype"] if key == "reduce_dtype" else None)
    return int(dtype.itemsize) if dtype is not None else int(unit["itemsize"])


def _name(dtype: Any) -> str:
    return _NAMES.get(str(dtype), "fp32")
