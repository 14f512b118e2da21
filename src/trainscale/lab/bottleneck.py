"""What bounds the step at N: the share of the N-process step each part of it takes, measured per rank and step.

The scaling loss says what N processes cost over one; a user also asks what bounds the job at all. A job that
waits for data 90% of the time at every scale scales perfectly and is still input-bound. Each rank's step splits,
from its per-step rows (``schema.STEP_ROW``), into

    input              the wait for the next batch
    cpu_contention     run-queue wait (runnable, but no core was free): the main thread's, and the backend
                       threads' as far as the step waited for the exchange
    waiting_for_peers  the wait in the exchange for the last rank to arrive (arrival times on a common clock)
    communication      the rest of the exposed exchange after backward
    compute            the rest: forward, backward, optimizer and host work, on the CPU

Shares are time-weighted over every rank's timed steps of the base phase, so they add up to 1. A part a run
did not measure (an older summary, a platform without schedstat) is 0 and listed under ``unmeasured``; what it
holds stays in ``compute`` (``communication`` when the exchange wait itself is missing).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..schema import Col, cell
from .advice.suggest import suggest
from .stats import arrivals_behind, job_step_time, step_runq

__all__ = ["PARTS", "step_shares", "bottleneck", "outside_load"]

PARTS = ("input", "compute", "communication", "cpu_contention", "waiting_for_peers")
OUTSIDE_CORES = 0.25  # cores that processes outside the job must use before the doctor counts them as a load


def outside_load(ctx: dict[str, Any]) -> bool:
    """Whether processes outside the job used at least ``OUTSIDE_CORES`` while it ran (the load monitor)."""
    return float((ctx.get("external") or {}).get("cores") or 0.0) >= OUTSIDE_CORES


def step_shares(rank_steps: list[list[list[float]]], backend: bool = True
                ) -> tuple[dict[str, float], list[str], dict[str, Any]]:
    """(share of each part, parts not measured, details: step seconds, last arrivals per rank) of one phase."""
    n = min((len(rows) for rows in rank_steps), default=0)
    sums = dict.fromkeys(PARTS, 0.0)
    total, missing = 0.0, set[str]()
    last = [0] * len(rank_steps)
    for i in range(n):
        rows = [r[i] for r in rank_steps]
        behind = arrivals_behind(rows)
        if math.isfinite(behind[0]):
            last[behind.index(0.0)] += 1
        for row, ahead in zip(rows, behind):
            step = cell(row, Col.STEP)
            if not math.isfinite(step) or step <= 0:
                continue
            parts = _split(row, step, ahead, missing, backend)
            for k, v in parts.items():
                sums[k] += v
            total += step
    shares = {k: (v / total if total else float("nan")) for k, v in sums.items()}
    return shares, sorted(missing), {"step_s": total / (n * len(rank_steps)) if n else float("nan"),
                                     "last_arrivals": last, "steps": n}


def _split(row: list[float], step: float, behind: float, missing: set[str], backend: bool = True
           ) -> dict[str, float]:
    """One rank's step in seconds per part; ``behind``: how long before the last rank this rank arrived."""
    wait = max(0.0, cell(row, Col.DATA_WAIT) if math.isfinite(cell(row, Col.DATA_WAIT)) else 0.0)
    runq, comm = step_runq(row, backend, behind), cell(row, Col.COMM_WAIT)
    if not math.isfinite(runq):
        missing.add("cpu_contention")
        runq = 0.0
    peers = 0.0
    if not math.isfinite(comm):
        missing.update(("communication", "waiting_for_peers"))
        comm = 0.0
    else:
        # The backend threads' wait for a core inside the exposed exchange is CPU contention, not the exchange.
        in_exchange = runq - cell(row, Col.RUNQ_MAIN)
        comm = max(0.0, comm - in_exchange) if math.isfinite(in_exchange) else comm
        if math.isfinite(behind):
            peers = min(max(0.0, behind), comm)  # a rank that waits in the exchange waits for the last one first
        else:
            missing.add("waiting_for_peers")
    # Parts are bounded by the step, in the order they are certain: a wait measured directly first.
    # (``runq`` holds the backend's share of the exchange already, so ``comm`` is the rest of it.)
    wait = min(wait, step)
    runq = min(max(0.0, runq), step - wait)
    peers = min(peers, step - wait - runq)
    comm = min(max(0.0, comm - peers), step - wait - runq - peers)
    return {"input": wait, "cpu_contention": runq, "waiting_for_peers": peers, "communication": comm,
            "compute": step - wait - runq - peers - comm}


def _mean_shares(parts: list[dict[str, Any]], backend: bool = True
                 ) -> tuple[dict[str, float], list[str], dict[str, Any]]:
    """Shares averaged over repeats (each repeat's rows are one run's aligned steps)."""
    each = [step_shares(p.get("rank_steps") or [], backend) for p in parts]
    each = [e for e in each if e[2]["steps"]]
    if not each:
        return dict.fromkeys(PARTS, float("nan")), [], {"step_s": float("nan"), "last_arrivals": [], "steps": 0}
    shares = {k: sum(e[0][k] for e in each) / len(each) for k in PARTS}
    missing = sorted({m for e in each for m in e[1]})
    last = [sum(x) for x in zip(*(e[2]["last_arrivals"] for e in each))]
    info = {"step_s": sum(e[2]["step_s"] for e in each) / len(each), "last_arrivals": last,
            "steps": sum(e[2]["steps"] for e in each)}
    return shares, missing, info


def _input_by_experiment(shares: dict[str, float], base: list[dict[str, Any]], no_data: list[dict[str, Any]]
                         ) -> float:
    """Raise the input share to what removing the input saves (base against no_data, paired), taken from compute.

    The wait in ``next()`` misses input work that runs beside the step but holds what the step needs: a loader
    thread whose Python collate holds the interpreter lock stalls the training loop inside forward and backward,
    not in ``next()``. The paired experiment sees it. Returns that saving as a share of the step (NaN without it).
    """
    pairs = [(job_step_time(b), job_step_time(d)) for b, d in zip(base, no_data)]
    saved = [(b - d) / b for b, d in pairs if math.isfinite(b) and math.isfinite(d) and b > 0]
    if not saved:
        return float("nan")
    by_experiment = min(max(0.0, statistics.median(saved)), 1.0)
    extra = max(0.0, by_experiment - shares["input"])
    # Where the stalled loop's time showed: inside the step's work, or, when the stall delays a rank's arrival,
    # as the exchange's wait and the wait for peers (measured, with the accounting on: the slow-collate job).
    for part in ("compute", "communication", "waiting_for_peers", "cpu_contention"):
        take = min(extra, shares[part]) if math.isfinite(shares[part]) else 0.0
        shares[part] -= take
        shares["input"] += take
        extra -= take
    return by_experiment


def bottleneck(base_n: list[dict[str, Any]], base_1: list[dict[str, Any]], n: int, ctx: dict[str, Any],
               no_data_n: list[dict[str, Any]] | None = None, no_data_1: list[dict[str, Any]] | None = None
               ) -> dict[str, Any]:
    """The ``bottleneck`` object of ``doctor.json``: the largest part of the N-process step, with its advice.

    ``base_n``/``base_1``: the base phase's summary part of each repeat at N and at 1 process (with ``rank_steps``);
    ``no_data_*``: the same runs' no_data phase, whose saving bounds the input share from below.
    """
    if base_n:  # what the exchange's advice is sized by, as the causes have it
        ctx = {"calls": base_n[0].get("allreduce_calls_per_step"), "bytes": base_n[0].get("comm_bytes_per_step"),
               "device": base_n[0].get("device"), "amp": base_n[0].get("amp"),
               "bf16_native": base_n[0].get("bf16_native", True), **ctx}
    # The backend threads' wait for a core inside the exchange counts as contention only under an outside load.
    outside = outside_load(ctx)
    shares, unmeasured, info = _mean_shares(base_n, outside)
    waited = shares.get("input", float("nan"))
    saved = _input_by_experiment(shares, base_n, no_data_n) if no_data_n and info["steps"] else float("nan")
    if not info["steps"]:
        return {"name": None, "share": float("nan"), "nproc": n, "shares": {}, "shares_at_1": {},
                "unmeasured": list(PARTS), "evidence": "no per-step rows in these runs", "advice": "",
                "apply_flags": {}}
    at_1 = _mean_shares(base_1, outside)[0] if base_1 else {}
    if at_1 and no_data_1:
        _input_by_experiment(at_1, base_1, no_data_1)
    name = max(PARTS, key=lambda k: shares[k] if math.isfinite(shares[k]) else -1.0)
    advice, flags = _advice(name, shares, info, n, ctx)
    pct = ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for k, v in shares.items() if math.isfinite(v))
    at1 = f" (at 1 process: {at_1[name]:.0%})" if at_1 and math.isfinite(at_1.get(name, math.nan)) else ""
    return {"name": name, "share": shares[name], "nproc": n, "shares": shares, "shares_at_1": at_1,
            "unmeasured": unmeasured, "step_s": info["step_s"], "last_arrivals": info["last_arrivals"],
            "input_waited_share": waited, "input_saved_share": saved,
            "evidence": f"of each {n}-process step: {pct}{at1}" + _input_note(waited, saved, ctx.get("workers")),
            "advice": advice, "apply_flags": flags}


def _input_note(waited: float, saved: float, workers: Any = None) -> str:
    """Why the input share exceeds the wait for the next batch, when it does (``workers``: the loader's worker
    processes, where known)."""
    if not (math.isfinite(saved) and math.isfinite(waited)) or saved < waited + 0.05:
        return ""
    how = (f"the loader's {workers} worker process(es) a rank take cores the step needs, and the training process "
           "unpickles what they send" if workers else
           "a Python collate in the loader's thread holds the interpreter lock the training loop needs")
    return (f"; the job waited for its next batch {waited:.0%} of the step, but keeping one batch on the device "
            f"made the step {saved:.0%} shorter: loading work beside the step ({how}) costs more than the wait "
            "shows")


def _advice(name: str, shares: dict[str, float], info: dict[str, Any], n: int, ctx: dict[str, Any]
            ) -> tuple[str, dict[str, str]]:
    """What to change for the part that bounds the step (flags that ``--apply`` can try, where there are some)."""
    if name == "input":
        text, flags = suggest("input", ctx)
        return (f"the job waits for its input {shares['input']:.0%} of the step: {text}; or pack the data set once "
                "(`trainscale data pack`) or decode on the GPU (--data.backend dali)", flags)
    if name == "communication":
        return suggest("communication", ctx)
    if name == "cpu_contention":
        return ("the ranks' threads wait for a free core: give each process cores of its own (--job.threads so that "
                "processes x threads + loader workers <= cores; taskset -c / numactl) and move other work off the "
                "machine", {})
    if name == "waiting_for_peers":
        last = info.get("last_arrivals") or []
        rank = max(range(len(last)), key=last.__getitem__) if any(last) else 0
        steps = max(1, info.get("steps") or 1)
        text, flags = suggest("straggler", {**ctx, "rank": rank})
        return (f"rank {rank} arrives last at {last[rank] / steps:.0%} of the steps and the others wait for it: "
                f"{text}" if last else text, flags)
    return _compute_advice(shares["compute"], ctx), {}


def _compute_advice(share: float, ctx: dict[str, Any]) -> str:
    """The step is the model's own work: how to make it cheaper on the device and precision the job ran with."""
    device = "GPU" if ctx.get("device") == "cuda" else "CPU"
    cheaper = ["torch.compile", f"a larger per-device batch (--batch-size {2 * int(ctx.get('batch_size', 32))})"]
    # Already mixed precision, or bf16 emulated on this device (slower than fp32): nothing to gain from asking.
    if ctx.get("amp") in (None, "", "none") and ctx.get("bf16_native", True):
        cheaper.insert(0, "bf16 autocast (--strategy.amp bf16)")
    return (f"the step is the model's own work on the {device} ({share:.0%}): the processes scale it; to make each "
            f"step cheaper use {', '.join(cheaper[:-1])} or amortise the per-step work over {cheaper[-1]}")
