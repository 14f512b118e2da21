"""FSDP (ZeRO-3) step cost: per-unit all-gather and reduce-scatter overlapped with compute. Pure functions.

Each wrapped unit (a transformer block) all-gathers its parameters before its forward and again before its
backward, and reduce-scatters its gradients after its backward, as FSDP2 does with ``reshard_after_forward``.
The next unit's all-gather is issued when the current unit's compute starts (one unit of prefetch, FSDP2's
default); all collectives share one link, so they run one after another in the order they are issued. The
root's parameters (embeddings, output layer) are gathered before the first unit and reduce-scattered after the
last backward: that part is never hidden. A ring all-gather (or reduce-scatter) is half a ring all-reduce
(Patarasuk and Yuan 2009): callers pass ``lambda n: cluster.allreduce_s(n, world) / 2``.

Example::

    units = [FsdpUnit(218e6, fwd_s=0.025, bwd_s=0.05)] * 32
    t = fsdp_step(units, gather_s=lambda n: n / 300e9, reduce_s=lambda n: n / 300e9, root_params=1.05e9)
    t.step_s, t.exposed_s
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["FsdpUnit", "FsdpTimes", "fsdp_step", "transformer_units"]


@dataclass(frozen=True)
class FsdpUnit:
    """One FSDP-wrapped module: its parameters and its forward and backward compute on one device."""

    params: float
    fwd_s: float
    bwd_s: float


@dataclass(frozen=True)
class FsdpTimes:
    """One step: its length, the compute in it, and the communication not hidden behind compute."""

    step_s: float
    compute_s: float
    comm_s: float

    @property
    def exposed_s(self) -> float:
        return self.step_s - self.compute_s


def _forward(units: Sequence[FsdpUnit], gather: Callable[[FsdpUnit], float], t0: float) -> tuple[float, float]:
    """(compute end, link free at) after the forward, the link free from ``t0`` on."""
    link = t0 + gather(units[0])
    ready, t = link, t0
    for i, u in enumerate(units):
        start = max(t, ready)
        if i + 1 < len(units):  # prefetch: the next gather is issued as this unit's compute starts
            link = max(link, start) + gather(units[i + 1])
            ready = link
        t = start + u.fwd_s
    return t, link


def _backward(units: Sequence[FsdpUnit], gather: Callable[[FsdpUnit], float], reduce: Callable[[FsdpUnit], float],
              t0: float, link: float) -> tuple[float, float]:
    """(compute end, link free at) after the backward: units in reverse, gathers ahead, reduce-scatters behind."""
    order = list(reversed(units))
    link = max(link, t0) + gather(order[0])
    ready, t = link, t0
    for i, u in enumerate(order):
        start = max(t, ready)
        if i + 1 < len(order):
            link = max(link, start) + gather(order[i + 1])
            ready = link
        t = start + u.bwd_s
        link = max(link, t) + reduce(u)  # this unit's gradients leave as soon as its backward ends
    return t, link


def fsdp_step(units: Sequence[FsdpUnit], gather_s: Callable[[float], float], reduce_s: Callable[[float], float],
              gather_bytes: float = 2.0, reduce_bytes: float = 4.0, root_params: float = 0.0,
              other_s: float = 0.0) -> FsdpTimes:
    """One FSDP step; ``gather_s(n)`` / ``reduce_s(n)`` time a collective of n bytes (the unsharded size).

    ``gather_bytes`` per parameter all-gathered (2: bf16), ``reduce_bytes`` per gradient reduce-scattered
    (4: fp32, torchtitan's default ``mixed_precision_reduce``); ``other_s`` is the optimizer and loop after the
    last reduce-scatter.
    """
    compute = sum(u.fwd_s + u.bwd_s for u in units) + other_s
    if not units:
        return FsdpTimes(compute, compute, 0.0)

    def gather(u: FsdpUnit) -> float:
        return gather_s(u.params * gather_bytes) if u.params else 0.0

    def reduce(u: FsdpUnit) -> float:
        return reduce_s(u.params * reduce_bytes) if u.params else 0.0

    root_in = gather_s(root_params * gather_bytes) if root_params else 0.0
    root_out = reduce_s(root_params * reduce_bytes) if root_params else 0.0
    fwd_end, link = _forward(units, gather, root_in)
    bwd_end, link = _backward(units, gather, reduce, fwd_end, link)
    end = max(bwd_end, link) + root_out + other_s
    comm = root_in + root_out + sum(2 * gather(u) + reduce(u) for u in units)
    return FsdpTimes(end, compute, comm)


def half_allreduce(allreduce_s: Callable[[float, int], float], world: int) -> Callable[[float], float]:
    """``gather_s``/``reduce_s`` for ``fsdp_step``: a ring all-gather or reduce-scatter of n bytes is one of a ring
    all-reduce's two passes, half its time (``allreduce_s(n, world)``, e.g. ``ClusterSpec.allreduce_s``)."""
    return lambda n: allreduce_s(n, world) / 2


def transformer_units(layers: int, layer_params: float, compute_s: float, head_share: float = 0.0,
                      backward_share: float = 2 / 3) -> list[FsdpUnit]:
    """``layers`` equal blocks sharing ``compute_s`` (forward + backward), plus a compute-only head unit.

    ``head_share`` of the compute is the output layer's (it belongs to the root unit: no gather of its own).
    """
    body = compute_s * (1 - head_share) / max(1, layers)
    units = [FsdpUnit(layer_params, body * (1 - backward_share), body * backward_share) for _ in range(layers)]
    if head_share:
        head = compute_s * head_share
        units.append(FsdpUnit(0.0, head * (1 - backward_share), head * backward_share))
    return units
