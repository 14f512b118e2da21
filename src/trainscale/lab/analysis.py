"""The doctor's analysis: the scaling loss split into causes (``terms``), the measured wait for a core taken out
of where it hid (``contention``), each cause judged against its noise, then the parts that add up to the loss
(``decomposition``).

Every term is computed per repeat; its value is the median over repeats; its noise is twice the standard error
of the medians it is made of (from each phase's own step-to-step spread), the largest over repeats. A cause is
significant when every repeat exceeds its noise (``low_s`` > 0) and it is at least ``min_share`` of the loss
(of the N-process step time when the loss itself is not significant) and ``min_step_share`` of the N-process
step: a job that loses less than that to a cause is not held back by it, however well the cost is measured.
When an outside load clearly cost the job (``external_load``), an internal cause smaller than it stays ``likely``
(``confounded_by_load``): the neighbour slows the collectives and the waits as well as the compute.
"""

from __future__ import annotations

import math
from typing import Any

from .bottleneck import bottleneck
from .causes import Runs
from .contention import confounded_by_load, cpu_contention, external_load, loader_competes
from .decomposition import decompose, what_if
from .invariants import explain_rest, violations, widen_to_point
from .stats import median
from .terms import COMM_OPS, CONFIGS, measure, measured_exchange, op_excess

__all__ = ["CONFIGS", "CAUSES", "analyse", "op_excess", "COMM_OPS", "external_load", "confounded_by_load",
           "cpu_contention", "measured_exchange"]

CAUSES = ("communication", "sync_wait", "input", "compute_interference", "framework_overhead", "slow_operator",
          "straggler", "threads", "external_load", "cpu_contention")

# Causes measured inside the phased runs: their intervals come from resampling those runs' cycles.
BOOTSTRAPPED = ("input", "communication", "sync_wait", "straggler", "compute_interference", "external_load",
                "cpu_contention")


def analyse(runs: Runs, n: int, ctx: dict[str, Any], min_share: float = 0.15, min_step_share: float = 0.05,
            profiles: tuple[dict[str, Any], dict[str, Any]] | None = None,
            threads: dict[int, list[dict[str, Any]]] | None = None, replicates: int = 300) -> dict[str, Any]:
    """Split the scaling loss of ``runs`` into ranked causes with intervals and verdicts (``terms``, then above).

    ``ctx`` carries what suggestions need (bucket_mb, overlap, workers, slow_rank, strategy fields) and
    ``external``: what else loaded the machine while the runs went (``neighbours.LoadMonitor``).
    """
    from .bootstrap import block_times, bootstrap, interval, outlier_count, verdict

    runs = measured_exchange(runs)
    causes, tot = measure(block_times(runs), n, ctx, profiles, threads)
    loss, tn = tot["loss"], tot["tn"]
    phased = any(p.get("rank_steps") for parts in runs.values() for p in parts)
    boot: dict[str, list[float]] = {}
    if phased and replicates:
        worst = next(c["rank"] for c in causes if c["name"] == "straggler")

        def estimate(rs: Runs) -> dict[str, float]:
            cs, t = measure(rs, n, ctx, profiles, threads, worst)
            return {**{c["name"]: c["seconds_per_step"] for c in cs}, "_loss": t["loss"]}
        boot = bootstrap(runs, estimate, replicates)
    loss_low = interval(boot["_loss"])[0] if "_loss" in boot else tot["loss_low"]
    real_loss = math.isfinite(loss_low) and loss_low > 0
    # Each cause is judged against its own noise, in every repeat: the phases of a run are paired, but whole runs
    # can differ 3x in how slow their collectives are, so the spread of a cause's size over repeats says how
    # reproducible its size is, not whether it exists. The loss is only the yardstick for "worth reporting".
    floor = max(min_share * (loss if real_loss else tn), min_step_share * tn)
    for c in causes:
        v = c["seconds_per_step"]
        if c["name"] in BOOTSTRAPPED and c["name"] in boot and not c.get("uses_sleep"):
            lo, hi, pp = interval(boot[c["name"]])
            c.update(low_s=lo, noise_s=(hi - lo) / 2, interval_s=[lo, hi], p_positive=pp, method="bootstrap")
        else:  # runs without phases (sleep test, thread counts, profiles): the normal-theory bound
            pp = 1.0 if c["low_s"] > 0 else 0.5
            c.update(interval_s=[c["low_s"], v + c["noise_s"]], p_positive=None, method="spread")
        widen_to_point(c)
        c["verdict"] = verdict(v, c["low_s"], pp, floor)
        if c["verdict"] == "clear" and any(x <= 0 for x in c["per_repeat_s"] if math.isfinite(x)):
            c["verdict"] = "likely"  # clear needs every repeat to show it: separate runs differ in placement
        c["significant"] = c["verdict"] == "clear"
    confounded_by_load(causes)
    loader_competes(causes, n)
    rank = {"clear": 0, "likely": 1, "undecided": 2, "no": 3}
    causes.sort(key=lambda c: (rank[c["verdict"]], -(c["share"] if math.isfinite(c["share"]) else -1e9)))
    result = {"scaling_loss_s": loss, "scaling_loss_noise_s": tot["loss_noise"], "scaling_loss_significant": real_loss,
            "step_time_1_s": tot["t1"], "step_time_n_s": tn, "nproc": n,
            "efficiency": median(s["samples_per_s"] for s in runs[("base", n)]) /
            (n * median(s["samples_per_s"] for s in runs[("base", 1)])), "repeats": tot["R"], "causes": causes,
            "statistics": {"method": "bootstrap over whole cycles of phases" if boot else "normal-theory spread",
                           "replicates": replicates if boot else 0, "level": 0.90,
                           "outlier_steps": outlier_count(runs)},
              "bottleneck": bottleneck(runs[("base", n)], runs.get(("base", 1), []), n, ctx,
                                       runs.get(("no_data", n)), runs.get(("no_data", 1)))}
    explain_rest(result)
    result["decomposition"], result["what_if"] = decompose(result), what_if(result)
    result["invariants"] = violations(result)
    return result
