"""What a synchronous step loses as ranks are added, beyond the wire: the slowest of N ranks, the reducer's own time.

Every rank's step varies a little (kernels, clocks, the loader, Python); a synchronous step ends when the slowest of
the ``world`` ranks ends, ``sigma x E[max of N standard normals]`` after the typical one (``order_stats.py``). Each
term is a quantity a user measures on their own job:

* ``spread``: (p90 - p10) / median of the device's step time (s/s); the device's own noise, a share of the step.
  An optimizer step of ``A`` accumulated micro-steps averages ``A`` independent noises: its spread is ``/ sqrt(A)``.
* ``reducer_passes``: what the data-parallel reducer adds per step at P > 1 beyond the wire (copies into and out of
  its buckets, hooks, waits on the communication stream), counted in passes over the gradient bytes at the GPU's
  memory bandwidth (a datasheet figure), so it moves with the model's size and the GPU; measured as the step at 2
  ranks with the all-reduce skipped minus the step at 1 (the doctor's no-exchange experiment), over one pass.
  ``gradient_as_bucket_view`` (no copies) and FSDP leave it out.
* ``host_jitter_s``: the standard deviation of the host's time per step (seconds), felt only where the step waits
  for the host every step (``host_sync``: a loss scaler reading its overflow flag, a ``loss.item()``); otherwise the
  queue of launched kernels absorbs it.
* ``epoch_cpu_s``: CPU seconds an epoch spends outside its steps (the loader's restart and its first batches,
  decoded on the host's cores, the epoch's logging), felt only where throughput is averaged over whole epochs: an
  epoch of ``S`` steps costs ``S x step + epoch_cpu_s / host cores``. Weak scaling on a fixed dataset gives each rank
  ``1/N`` of the epoch's steps, so the same seconds weigh ``N`` times as much per step at ``N`` devices as at one.
  Measured as an epoch's wall time minus the sum of its steps' times, times the cores its loader ran on.

``E[max]`` grows like ``sqrt(2 ln N)``: 1.42 at 8 ranks, 2.6 at 128, 3.0 at 512. That is what makes 128 GPUs lose
a few per cent where the communication model alone loses almost nothing.

Example::

    terms = ScaleTerms(spread=0.03, host_jitter_s=0.004)
    terms.wait_s(compute_s=0.3, world=128, host_sync=True)   # ~0.014 s: the slowest of 128 ranks
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .order_stats import expected_max_normal, sigma_from_spread

__all__ = ["ScaleTerms", "slowest_rank_s", "epoch_step_s", "catalog_terms", "with_extra"]


def slowest_rank_s(sigma_s: float, world: int) -> float:
    """Expected seconds the slowest of ``world`` ranks ends after the typical one, for noise of ``sigma_s``."""
    return sigma_s * expected_max_normal(world) if world > 1 and sigma_s > 0 else 0.0


def epoch_step_s(step_s: float, steps_per_epoch: float, overhead_s: float) -> float:
    """Mean wall seconds per step over an epoch of ``steps_per_epoch`` steps that spends ``overhead_s`` outside them
    (``steps_per_epoch`` 0: throughput timed over steps, not epochs)."""
    return step_s + overhead_s / steps_per_epoch if steps_per_epoch > 0 else step_s


@dataclass(frozen=True)
class ScaleTerms:
    """What a step loses as ranks are added beyond the wire: its noise, the reducer's time, an epoch's overhead."""

    spread: float = 0.0            # (p90 - p10) / median of one device's step time
    host_jitter_s: float = 0.0     # standard deviation of the host's time per step, seconds
    reducer_passes: float = 0.0    # the reducer's own time per step at P > 1, in passes over the gradient bytes
    epoch_cpu_s: float = 0.0       # CPU seconds an epoch spends outside its steps, spread over the host's cores

    def epoch_wall_s(self, host_cores: float) -> float:
        """Wall seconds an epoch spends outside its steps on a host of ``host_cores`` cores."""
        return self.epoch_cpu_s / host_cores if host_cores > 0 else 0.0

    def reducer_s(self, pass_s: float, world: int) -> float:
        """The reducer's time per step at ``world`` beyond the wire, ``pass_s`` the time of one pass over the
        gradients (their bytes over the GPU's memory bandwidth)."""
        return self.reducer_passes * pass_s if world > 1 else 0.0

    def sigma_s(self, compute_s: float, host_sync: bool, accumulation: int = 1) -> float:
        """The standard deviation of one rank's optimizer step (device noise and, where synced, host noise)."""
        device = sigma_from_spread(self.spread, compute_s) / math.sqrt(max(1, accumulation))
        host = self.host_jitter_s if host_sync else 0.0
        return math.hypot(device, host)

    def wait_s(self, compute_s: float, world: int, host_sync: bool = False, accumulation: int = 1) -> float:
        """Expected wait for the slowest of ``world`` ranks per optimizer step."""
        return slowest_rank_s(self.sigma_s(compute_s, host_sync, accumulation), world)


def catalog_terms() -> ScaleTerms:
    """The terms of ``catalog.json``'s ``scale_terms`` (fitted on the published sources; units there)."""
    from .hardware import catalog

    c = catalog()["scale_terms"]
    return ScaleTerms(float(c["spread"]["value"]), float(c["host_jitter_s"]["value"]), float(c["reducer_passes"]["value"]),
                      float(c["epoch_cpu_s"]["value"]))


def with_extra(points: list[Any], extra_s: Callable[[int], float]) -> list[Any]:
    """``points`` (``forecast.Point``) with ``extra_s(world)`` seconds added to every step at more than one device."""
    out = []
    for p in points:
        extra = extra_s(p.world_size) if p.world_size > 1 else 0.0
        if extra <= 0:
            out.append(p)
            continue
        k = p.step_time_s / (p.step_time_s + extra)
        out.append(replace(p, step_time_s=p.step_time_s + extra, samples_per_s=p.samples_per_s * k,
                           speedup=p.speedup * k, efficiency=p.efficiency * k, straggler_s=p.straggler_s + extra,
                           comm_overhead_s=p.comm_overhead_s + extra))
    return out
