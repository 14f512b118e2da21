"""The strategy's part of the run summary: the layout, communication volume and wait, memory, the layout's own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .zero import optimizer_state_bytes

if TYPE_CHECKING:
    from . import Strategy

__all__ = ["strategy_summary"]


def strategy_summary(p: Strategy, opt: torch.optim.Optimizer, skip: int, ablated: bool, calls: int) -> dict[str, Any]:
    """Fields added to (or refined in) the run summary; collective: call on every rank.

    ``skip``: warm-up steps left out of the averages; ``ablated``: the run had no gradient exchange. The
    layout adds its own (the bucket autotuner's choice, local SGD's divergence, ``fsdp``, ``pipeline``).
    """
    out: dict[str, Any] = {"layout": p.layout_name}
    comm = p.meter.summary(skip, ablated)
    out.update(comm)
    out["allreduce_calls_per_step"] = 0 if ablated else comm.pop("comm_calls_per_step", calls)
    out.pop("comm_calls_per_step", None)
    mem = torch.tensor([float(optimizer_state_bytes(opt))], device=next(p.module.parameters()).device)
    dist.all_reduce(mem, op=dist.ReduceOp.MAX)  # the fullest rank bounds the batch that fits
    out["optim_state_bytes"] = int(mem.item())
    peaks: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(peaks, p.memory.peak())
    out["peak_memory_bytes"], out["peak_memory_measure"] = peaks, p.memory.measure
    out.update(p.layout.report(skip))
    return out
