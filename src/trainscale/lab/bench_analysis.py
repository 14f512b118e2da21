"""The bench's analysis: a point per world size from its repeated runs, speed-up, efficiency and its range.

Pure code over run summaries, so tests drive it with numbers; the verdict that opens the report is
``verdict.bench_verdict`` over these points.
"""

from __future__ import annotations

from typing import Any

from .stats import job_step_time, median, rel_range

__all__ = ["make_point", "complete_points", "run_record", "thread_mismatch"]

# The fields of each run's summary that bench.json keeps (the report's per-rank chart and timeline read them).
RUN_FIELDS = ("world_size", "samples_per_s", "step_time_s", "step_time_spread", "data_wait_frac", "rank_compute_s",
              "rank_step_time_s", "rank_data_wait_s", "allreduce_calls_per_step", "global_batch", "timeline",
              "command")


def run_record(summary: dict[str, Any]) -> dict[str, Any]:
    """What bench.json keeps of one run's summary."""
    return {k: summary.get(k) for k in RUN_FIELDS}


def make_point(nproc: int, world: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and spreads of one world size's repeated runs (speed-up etc. are added by complete_points)."""
    sps = [r["samples_per_s"] for r in runs]
    return {
        "nproc": nproc, "world_size": world, "repeats": len(runs),
        "samples_per_s": median(sps), "spread": rel_range(sps),
        "step_time_s": median(job_step_time(r) for r in runs),
        "step_time_spread": median(r.get("step_time_spread") for r in runs),
        "data_wait_frac": median(r.get("data_wait_frac") for r in runs),
        "compute_s": median(max(r.get("rank_compute_s") or [float("nan")]) for r in runs),
        "global_batch": runs[0]["global_batch"], "batch_size": runs[0]["batch_size"],
        "threads": runs[0].get("threads"),
        "measured_steps": median(r.get("measured_steps") for r in runs),
        "samples_per_s_runs": sps, "step_time_s_runs": [job_step_time(r) for r in runs],
    }


def complete_points(points: list[dict[str, Any]], scaling: str) -> list[dict[str, Any]]:
    """Speed-up, efficiency, its range and the scaling overhead against the smallest world size measured."""
    if not points:
        return points
    base = points[0]
    for p in points:
        ratio = p["world_size"] / base["world_size"]
        p["speedup"] = p["samples_per_s"] / base["samples_per_s"]
        # efficiency = throughput(N) / (N x throughput(1)) (relative to the base world size when it is not 1)
        p["efficiency"] = p["samples_per_s"] / (ratio * base["samples_per_s"])
        ideal_t = base["step_time_s"] if scaling == "weak" else base["step_time_s"] / ratio
        # Everything that grows with processes (communication, waiting, contention), not communication alone;
        # comm_overhead_s is kept under its first name for readers of bench.json.
        p["scaling_overhead_s"] = p["comm_overhead_s"] = p["step_time_s"] - ideal_t
        # Range of the efficiency over every pairing of a run here with a run at the base size (its error bar).
        pairs = [t / (ratio * b) for t in p.get("samples_per_s_runs") or [] for b in base.get("samples_per_s_runs")
                 or [] if b > 0]
        p["efficiency_range"] = [min(pairs), max(pairs)] if pairs else [p["efficiency"], p["efficiency"]]
    return points


def thread_mismatch(points: list[dict[str, Any]]) -> str | None:
    """``"4 at 1, 2 at 2"`` when the points ran different intra-op threads per process (unlike), else None."""
    threads = {p["world_size"]: p.get("threads") for p in points}
    if len(set(threads.values())) > 1:
        return ", ".join(f"{t} at {w}" for w, t in threads.items())
    return None
