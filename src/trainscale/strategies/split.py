"""Where a pipeline cuts the model: pure functions over per-layer costs (no torch).

A split is the list of the layer indices at which each stage starts (``[0, ...]``, one per stage).

Example::

    balanced_split([1.0, 1.0, 1.0, 1.0, 4.0], 2)   # [0, 4]: stages of cost 4 and 4
    uniform_split(5, 2)                             # [0, 3]: stages of cost 3 and 5
"""

from __future__ import annotations

__all__ = ["balanced_split", "uniform_split", "named_split", "stage_costs", "imbalance"]


def balanced_split(costs: list[float], parts: int) -> list[int]:
    """Contiguous split into ``parts`` non-empty stages that minimises the largest stage sum (exact, O(parts n^2)).

    The balanced linear partition of torchgpipe's ``balance_by_time`` and DeepSpeed's ``partition_balanced``;
    among equally good splits, the one whose stages' sums are most even (the smallest sum of squares).
    """
    n = len(costs)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} layers into {parts} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = (float("inf"), float("inf"))
    # best[k][i]: (largest stage, sum of squares) splitting the first i layers into k stages; cut[k][i]: last start
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                prev = best[k - 1][j]
                if prev[0] == float("inf"):
                    continue
                s = prefix[i] - prefix[j]
                cand = (max(prev[0], s), prev[1] + s * s)
                if cand < best[k][i]:
                    best[k][i], cut[k][i] = cand, j
    starts, i = [], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        starts.append(i)
    return starts[::-1]


def uniform_split(n: int, parts: int) -> list[int]:
    """Equal layer counts (the first stages take one more when ``parts`` does not divide ``n``)."""
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} layers into {parts} stages")
    size, extra = divmod(n, parts)
    starts, at = [], 0
    for k in range(parts):
        starts.append(at)
        at += size + (k < extra)
    return starts


def named_split(names: list[str], firsts: list[str], parts: int) -> list[int]:
    """The split whose stages 2..parts start at the layers named ``firsts`` (in order)."""
    if len(firsts) != parts - 1:
        raise ValueError(f"give {parts - 1} layer names (where stages 2..{parts} start), got {len(firsts)}")
    unknown = [f for f in firsts if f not in names]
    if unknown:
        raise ValueError(f"no layer named {unknown[0]!r}; layers are {', '.join(names)}")
    starts = [0] + [names.index(f) for f in firsts]
    if any(b <= a for a, b in zip(starts, starts[1:])):
        raise ValueError("the names must be in model order, after the first layer, each starting a non-empty stage")
    return starts


def stage_costs(costs: list[float], starts: list[int]) -> list[float]:
    """Each stage's summed cost."""
    ends = starts[1:] + [len(costs)]
    return [sum(costs[a:b]) for a, b in zip(starts, ends)]


def imbalance(stage_times: list[float]) -> float:
    """Slowest stage over the mean stage (1.0: balanced); a pipeline runs at its slowest stage's pace."""
    mean = sum(stage_times) / len(stage_times) if stage_times else 0.0
    return max(stage_times) / mean if mean > 0 else float("nan")
