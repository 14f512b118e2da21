"""Step-level cost models: fusion buckets and their overlap with backward, compression, local SGD,
ZeRO-1, the pipeline bubble and the input pipeline's bound. Pure functions (no torch).

Example::

    b = make_buckets([4e6] * 10, cap_bytes=25e6)       # gradient tensors in backward order
    exposed_comm(b, ready_at(b, [4e6] * 10, backward_s=0.2), lambda n: n / 10e9, backward_s=0.2)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["make_buckets", "ready_at", "exposed_comm", "compressed_bytes", "COMPRESSION", "local_sgd_comm",
           "zero1_comm_bytes", "pipeline_bubble", "input_bound_step", "profile_tensors"]

# DDP puts its first bucket at 1 MB so the first all-reduce starts early (torch.distributed
# _DEFAULT_FIRST_BUCKET_BYTES); later buckets are bucket_cap_mb.
FIRST_BUCKET_BYTES = 1024 * 1024

# Bytes on the wire per fp32 byte, and the share of a step's compute the codec costs (assumptions,
# docs/plan.md): fp16/bf16 hooks cast before and after the all-reduce.
COMPRESSION = {"none": 1.0, "fp16": 0.5, "bf16": 0.5}


def make_buckets(tensor_bytes: Sequence[float], cap_bytes: float, first_cap: float = FIRST_BUCKET_BYTES) -> list[float]:
    """Group gradient tensors (in the order backward produces them) into fusion buckets of about ``cap_bytes``.

    ``cap_bytes = 0`` gives one bucket per tensor (no fusion). A tensor larger than the cap gets its own bucket.
    """
    if cap_bytes <= 0:
        return [float(b) for b in tensor_bytes if b > 0]
    out: list[float] = []
    cur, cap = 0.0, min(first_cap, cap_bytes) if first_cap else cap_bytes
    for b in tensor_bytes:
        cur += b
        if cur >= cap:
            out.append(cur)
            cur, cap = 0.0, cap_bytes
    if cur > 0:
        out.append(cur)
    return out


def profile_tensors(total_bytes: float, tail_share: float = 0.0, tail_compute: float = 0.0,
                    pieces: int = 100) -> tuple[list[float], list[float]]:
    """A model without its own layer list: (tensor bytes, backward-progress share of each) in backward order.

    The first ``tail_share`` of the bytes (a classifier head, first in backward) costs ``tail_compute`` of the
    backward; the rest is spread uniformly over the remaining backward time.
    """
    sizes, costs = [], []
    if tail_share > 0:
        sizes.append(total_bytes * tail_share)
        costs.append(tail_compute)
    body = total_bytes * (1 - tail_share)
    for _ in range(pieces):
        sizes.append(body / pieces)
        costs.append((1 - tail_compute) / pieces)
    return sizes, costs


def ready_at(buckets: Sequence[float], tensor_bytes: Sequence[float], backward_s: float,
             tensor_costs: Sequence[float] | None = None) -> list[float]:
    """Seconds into backward at which each bucket's last gradient is ready.

    ``tensor_costs``: each tensor's share of backward time (default: in proportion to its bytes).
    """
    total = float(sum(tensor_bytes)) or 1.0
    costs = list(tensor_costs) if tensor_costs is not None else [b / total for b in tensor_bytes]
    ready, t, filled, i = [], 0.0, 0.0, 0
    for size in buckets:
        while filled < size - 1e-6 and i < len(tensor_bytes):
            filled += tensor_bytes[i]
            t += costs[i] * backward_s
            i += 1
        filled -= size
        ready.append(min(t, backward_s))
    return ready


def exposed_comm(buckets: Sequence[float], ready: Sequence[float], time_of: Callable[[float], float],
                 backward_s: float, overlap: bool = True) -> tuple[float, float]:
    """(exposed seconds after backward, total seconds of communication) for buckets all-reduced in order.

    With overlap a bucket starts when it is ready and the previous one is done; only the tail past the end
    of backward is exposed (all-reduce overlapped with backprop). Without overlap everything runs after backward.
    """
    total = sum(time_of(b) for b in buckets)
    if not overlap:
        return total, total
    end = 0.0
    for size, r in zip(buckets, ready):
        end = max(end, r) + time_of(size)
    return max(0.0, end - backward_s), total


def compressed_bytes(nbytes: float, method: str, powersgd_rank: int = 1, shapes: Sequence[tuple[int, int]] = ()) -> float:
    """Bytes on the wire after compression: fp16/bf16 halve them; PowerSGD sends (n + m) x rank per n x m matrix.

    Without matrix shapes PowerSGD is estimated for square matrices: 2 sqrt(n) r per n elements.
    """
    if method in COMPRESSION:
        return nbytes * COMPRESSION[method]
    if method != "powersgd":
        raise ValueError(f"unknown compression {method!r}")
    if shapes:
        return sum((n + m) * powersgd_rank * 4.0 for n, m in shapes)
    elems = nbytes / 4.0
    return min(nbytes, 2.0 * (elems ** 0.5) * powersgd_rank * 4.0 * 10)  # ~10 matrices per model (assumption)


def local_sgd_comm(allreduce_s: float, period: int) -> float:
    """Communication per step with local SGD: one parameter average every ``period`` steps."""
    return allreduce_s / max(1, period)


def zero1_comm_bytes(nbytes: float) -> float:
    """ZeRO-1 per rank: reduce-scatter of gradients plus all-gather of parameters = the ring all-reduce's bytes.

    The volume equals an all-reduce's (Rajbhandari et al. 2020, section 7); what changes is the optimizer memory
    (1/P per rank) and that the update runs on 1/P of the parameters.
    """
    return nbytes


def pipeline_bubble(stages: int, microbatches: int, schedule: str = "1f1b") -> float:
    """Idle share of a pipeline step: (S - 1) / (M + S - 1) for GPipe and 1F1B; interleaved divides by v.

    ``schedule`` is ``gpipe``, ``1f1b`` or ``interleaved:V`` (V model chunks per stage, Narayanan et al. 2021).
    """
    if stages <= 1:
        return 0.0
    v = 1
    if schedule.startswith("interleaved"):
        v = int(schedule.partition(":")[2] or 2)
    elif schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"unknown schedule {schedule!r}")
    idle = (stages - 1) / v
    return idle / (microbatches + idle)


def input_bound_step(samples_per_step: float, input_samples_per_s: float | None) -> float:
    """The shortest step the input pipeline allows (0 when its rate is unknown)."""
    if not input_samples_per_s:
        return 0.0
    return samples_per_step / input_samples_per_s
