"""CPU contention: the measured wait for a core, who took the cores, and the causes it confounds.

A rank runnable but not running waits for a core; a synchronous step waits for its most descheduled rank. The
doctor measures that wait (schedstat, ``stats.critical_runq``), takes it out of the causes it inflated
(``cpu_contention``), names who held the cores (outside processes, or the job's own threads), and marks the
internal causes an outside load may explain (``confounded_by_load``, ``loader_competes``); without run-queue
accounting, ``external_load`` reasons from the load monitor and the job's thread demand instead.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from .bottleneck import outside_load
from .causes import make_cause
from .neighbours import describe
from .stats import median

__all__ = ["CONTENDED", "cpu_contention", "external_load", "confounded_by_load", "loader_competes"]

# Causes a measured CPU wait hides in, in the order it is taken out of them: a descheduled rank keeps the others
# waiting inside the collective first, then looks like a jittery or slow rank, then like slower compute.
CONTENDED = ("communication", "sync_wait", "straggler", "compute_interference")


def cpu_contention(causes: list[dict[str, Any]], ctx: dict[str, Any], n: int, base_1: list[dict[str, Any]],
                   base_n: list[dict[str, Any]], se: dict[tuple[str, int], list[float]], loss: float) -> bool:
    """Measured CPU contention: the step's critical run-queue wait at N minus at 1, taken out of where it hid.

    Each rank's main thread reports how long it was runnable but not running (schedstat); a synchronous step
    waits for its most descheduled rank (``stats.critical_runq``). What that wait grew by from 1 to N processes
    is this cause. It is taken out of the causes it inflated (``CONTENDED``, then input under an outside load, in
    that order, never below zero) and each move is written in both rows. Who took the CPU: the processes outside
    the job that the load monitor saw, else the job's own threads when processes x threads + loader workers exceed
    the cores. Returns False (and adds nothing) when the runs have no run-queue column.
    """
    # The backend threads' wait inside the exchange is the neighbour's doing only when something outside the job
    # takes cores; otherwise it is the exchange's own demand for them (161 tiny all-reduces keep Gloo's threads
    # runnable), which the exchange's own fix removes, so it stays communication.
    key = "runq_crit_s" if outside_load(ctx) else "runq_main_crit_s"
    r1 = [p.get(key, float("nan")) for p in base_1]
    rn = [p.get(key, float("nan")) for p in base_n]
    if not r1 or len(r1) != len(rn) or not all(math.isfinite(v) for v in r1 + rn):
        return False
    by = {c["name"]: c for c in causes}
    caps = {"straggler": _straggler_waits(base_n, (by.get("straggler") or {}).get("rank"))}
    moved, kept = _split_wait([b - a for a, b in zip(r1, rn)], by, outside_load(ctx), caps)
    per_repeat = [b - a - k for a, b, k in zip(r1, rn, kept)]
    cause = make_cause("cpu_contention", per_repeat, [se["base", 1], se["base", n]], loss,
                       _contention_evidence(ctx, n, r1, rn), *_contention_advice(ctx, n), who=_who(ctx, n))
    cause["moved_from"] = []
    if (k := statistics.median(kept)) > 0:
        cause["kept_in_communication_s"] = k
        by["communication"]["evidence"] += (
            f" (including {k * 1e3:.2f} ms/step the ranks waited for a core after each of its wake-ups: fusing the "
            "all-reduces removes them, so that wait is counted here, not under cpu_contention)")
        cause["evidence"] += (f"; {k * 1e3:.2f} ms/step more of the wait was inside the exchange's small all-reduces "
                              "and is counted under communication, whose fix (bigger buckets) removes those wake-ups")
    for name, part in moved.items():
        _move(by[name], part, cause)
    causes.append(cause)
    return True


def _straggler_waits(base_n: list[dict[str, Any]], rank: int | None) -> list[float]:
    """Per repeat: how much longer the straggler's training thread waited for a core than the others' median.

    A rank that computes longer because it waited for a core waited longer than the others: only that excess can
    be the wait's doing. A rank slower for its own reasons (a slower forward, a slower device) waits no longer
    for a core than the others, and its whole extra compute stays the straggler's, however much the others
    waited (a slowed rank 1 on 2 cores here: 4.8 ms/step longer compute, 0.8 ms more wait for a core).
    Infinite (no cap) without per-rank run-queue figures.
    """
    out = []
    for p in base_n:
        rq = p.get("rank_runq_main_s") or []
        if rank is None or not 0 <= rank < len(rq) or len(rq) < 2 or not all(math.isfinite(v) for v in rq):
            out.append(math.inf)
            continue
        others = rq[:rank] + rq[rank + 1:]
        out.append(max(0.0, rq[rank] - statistics.median(others)))
    return out


def _split_wait(per_repeat: list[float], by: dict[str, dict[str, Any]], outside: bool,
                caps: dict[str, list[float]] | None = None) -> tuple[dict[str, list[float]], list[float]]:
    """(per cause, the wait taken out of it per repeat; per repeat, the wait that stays in communication).

    Each repeat's wait is taken from ``CONTENDED`` in order, never more than a cause holds nor below zero, nor
    more than the cause's cap that repeat (``caps``: what the measured waits can explain of it).
    """
    moved: dict[str, list[float]] = {}
    # Under an outside load the measured wait is every thread's, the loader's among them: a batch that came late
    # because its loader thread waited for a core is that wait too (taken last, after what the ranks' waits hid in).
    contended = (*CONTENDED, "input") if outside else CONTENDED
    stays = _wakeups_stay(by.get("communication"))
    kept = [0.0] * len(per_repeat)
    for i, v in enumerate(per_repeat):
        left = max(0.0, v)
        for name in contended:
            c = by.get(name)
            if c is None or i >= len(c["per_repeat_s"]):
                continue
            cap = (caps or {}).get(name, [])
            take = min(left, max(0.0, c["per_repeat_s"][i]), cap[i] if i < len(cap) else math.inf)
            left -= take
            if name == "communication" and stays:
                kept[i] = take
            else:
                moved.setdefault(name, [0.0] * len(per_repeat))[i] = take
    return moved, kept


def _move(c: dict[str, Any], part: list[float], cause: dict[str, Any]) -> None:
    """Take ``part`` (per repeat) out of cause ``c`` into ``cause``, and write the move in both rows."""
    amount = statistics.median(part)
    if amount <= 0:
        return
    rest = [v - m for v, m in zip(c["per_repeat_s"], part)]
    old = c["seconds_per_step"]
    c.update(seconds_per_step=statistics.median(rest), per_repeat_s=rest)
    c["share"] = c["seconds_per_step"] / old * c["share"] if old else 0.0
    c.setdefault("moved_to", []).append({"cause": "cpu_contention", "s": amount})
    cause["moved_from"].append({"cause": c["name"], "s": amount})
    c["evidence"] += (f" ({amount * 1e3:.2f} ms/step of it counted under cpu_contention: the ranks' measured "
                      "wait for a free core, which also holds the others up in the exchange)")


def _wakeups_stay(comm: dict[str, Any] | None) -> bool:
    """Whether the wait for a core inside the exchange stays in ``communication``: when the bucket fix applies.

    Each all-reduce wakes the ranks, and each wake-up waits for a core again, so a tiny-bucket exchange on shared
    cores pays that wait dozens of times a step. Fusing the all-reduces removes it with or without a neighbour;
    removing the neighbour removes little of it. Measured here (34 all-reduces per step, 2 processes on 2 cores):
    30-40 ms/step at 2 processes on a quiet machine, 41-43 ms beside a bursty loop on one core; 4.3-7.5 ms with
    one bucket either way. So it is the exchange's cause, with the bucket change as its fix, and the wait is
    noted in both rows.
    """
    return comm is not None and "strategy.bucket_mb" in comm["apply_flags"]


def _who(ctx: dict[str, Any], n: int) -> dict[str, Any]:
    """Who took the cores: outside processes (pid, name, cores) and the job's own demand against the cores."""
    ext = ctx.get("external") or {}
    threads, workers = int(ctx.get("threads") or 1), int(ctx.get("workers") or 0)
    cores = ext.get("machine_cores") or ctx.get("cores") or 0
    demand = n * (threads + workers)
    # Processes outside that used fewer than OUTSIDE_CORES together (a shell, the launcher) did not take the cores
    # the ranks waited for: the job's own threads did, and the report says so rather than name a bystander.
    outside = ext.get("top", [])[:5] if outside_load(ctx) else []
    return {"outside": outside,  # the load monitor lists only processes over its min_cores
            "whose": "outside" if outside else "own",
            "outside_cores": ext.get("cores") or 0.0, "job_threads": demand, "cores": cores,
            "oversubscribed": bool(cores and demand > cores),
            # Gloo (any CPU device) runs each collective on threads of the rank's own, beside its compute threads.
            "exchange_on_cpu": ctx.get("backend") == "gloo" or ctx.get("device") == "cpu"}


def _contention_evidence(ctx: dict[str, Any], n: int, r1: list[float], rn: list[float]) -> str:
    w = _who(ctx, n)
    by = ", ".join(describe(p) for p in w["outside"])
    own = (f"the job runs {w['job_threads']} compute threads ({n} processes x (intra-op threads + loader workers)) "
           f"on {w['cores']} cores" + (", and each process's exchange runs on CPU threads of its own (Gloo) beside "
                                       "them" if w["exchange_on_cpu"] else ""))
    return (f"the most descheduled rank's threads waited for a core {median(rn) * 1e3:.2f} ms/step at {n} "
            f"processes vs {median(r1) * 1e3:.2f} ms at 1 (schedstat run-queue time of the main thread, and of the "
            "backend's inside the exposed exchange); "
            + (f"outside the job: {by}; " if by else "no outside process used the CPU: the threads that held the "
               "cores are the job's own; ") + own)


def _contention_advice(ctx: dict[str, Any], n: int) -> tuple[str, dict[str, str]]:
    w = _who(ctx, n)
    if w["outside"]:
        names = ", ".join(describe(p, cores=False) for p in w["outside"][:3])
        return (f"move {names} off the cores the job uses, or pin the job's processes to cores of their own "
                "(taskset -c / numactl --physcpubind)", {})
    if w["oversubscribed"]:
        fit = max(1, w["cores"] // n - int(ctx.get("workers") or 0))
        return (f"the job oversubscribes the cores: --job.threads {fit} (so that processes x threads + workers <= "
                f"{w['cores']} cores)", {"job.threads": str(fit)})
    if w["exchange_on_cpu"]:
        return _own_exchange_advice(ctx, n, w)
    return ("the ranks wait for a core though nothing else seems to run: check the cores this job may use "
            "(taskset -p, the container's CPU quota)", {})


def _own_exchange_advice(ctx: dict[str, Any], n: int, w: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """Nothing outside and no more compute threads than cores: the job's own exchange threads take the cores.

    Gloo runs each all-reduce on CPU threads of the rank's own, runnable while the compute threads are; 2 ranks
    with 1 thread each on 2 cores put 4 runnable threads on 2 cores in every exchange that overlaps backward.
    """
    threads = int(ctx.get("threads") or 1)
    who = (f"the job's own exchange threads: Gloo runs each all-reduce on CPU threads, which compete with the "
           f"{w['job_threads']} compute thread(s) of its {n} processes for {w['cores']} cores")
    if threads > 1:
        return (f"the ranks wait for cores held by {who}; leave each process a core for its exchange: "
                f"--job.threads {threads - 1}", {})  # advice: thread counts are measured in their own what-if
    return (f"the ranks wait for cores held by {who}; give each process a core for its exchange (fewer processes "
            f"than cores), or exchange less often (--strategy.grad_accum 2)", {})


def external_load(causes: list[dict[str, Any]], ctx: dict[str, Any], n: int, base_n: dict[str, Any],
                  base_1: dict[str, Any], compute_n: list[float]) -> None:
    """Name what else used the machine when it took cores the job needed at N (not at 1).

    The neighbour cannot be switched off as an experiment, so the doctor reasons from what it measured: when
    the job's N processes x threads plus the outside load exceed the cores, time-sharing stretches compute at N
    by at most f = (job's threads + outside cores) / cores. That share of the N-process compute time
    (``compute_n`` x (1 - 1/f)), and no more than compute interference measured, moves to ``external_load``.
    The exchange and the per-step waits are the same ranks' threads, stretched by the same measured share: that
    fraction of ``communication`` and ``sync_wait`` moves too. What the neighbour cannot explain (an operator slow
    only at N, an exchange the compute's stretch does not account for) stays where it was measured.
    """
    ext = ctx.get("external") or {}
    cores, used = ext.get("machine_cores") or 0, ext.get("cores") or 0.0
    if not outside_load(ctx) or not cores:
        return
    need_n = n * (base_n.get("threads") or 1)
    need_1 = base_1.get("threads") or 1
    if need_n + used <= cores:
        return
    f = (need_n + used) / cores
    by = {c["name"]: c for c in causes}
    ci = by["compute_interference"]
    moved = [max(0.0, min(v, t * (1 - 1 / f))) for v, t in zip(ci["per_repeat_s"], compute_n)]
    # The share of the N-process compute the neighbour took, per repeat (at most 1 - 1/f).
    stretch = [m / t if t > 0 else 0.0 for m, t in zip(moved, compute_n)]
    taken = {"compute_interference": moved}
    for name in ("communication", "sync_wait"):
        taken[name] = [max(0.0, v) * s for v, s in zip(by[name]["per_repeat_s"], stretch)]
    total = [sum(parts) for parts in zip(*taken.values())]
    value = statistics.median(total) if total else 0.0
    who = ", ".join(describe(p) for p in ext.get("top", [])[:3])
    split = ", ".join(f"{statistics.median(v) * 1e3:.2f} ms of {k.replace('_', ' ')}" for k, v in taken.items())
    evidence = (f"outside the job, {used:.2f} of this machine's {cores} cores were busy while it ran: {who}; the job "
                f"needs {need_n} at {n} processes ({need_1} at 1), so time-sharing stretches its compute at {n} up to "
                f"{f:.2f}x; it took {statistics.median(stretch):.0%} of the compute's time at {n}, and that share of "
                f"the exchange and the waits: {value * 1e3:.2f} ms/step ({split})")
    causes.append({**ci, "name": "external_load", "seconds_per_step": value, "per_repeat_s": total,
                   "moved_from": [{"cause": k, "s": statistics.median(v)} for k, v in taken.items()],
                   "share": value / ci["seconds_per_step"] * ci["share"] if ci["seconds_per_step"] else float("nan"),
                   "evidence": evidence, "processes": ext.get("top", [])[:5], "apply_flags": {},
                   "suggestion": "pin the job's processes to cores of their own (taskset -c / numactl --physcpubind), "
                                 "or move the other work off this machine while training"})
    for name, part in taken.items():
        c = by[name]
        rest = [v - m for v, m in zip(c["per_repeat_s"], part)]
        old = c["seconds_per_step"]
        c.update(seconds_per_step=statistics.median(rest) if rest else 0.0, per_repeat_s=rest)
        c["share"] = c["seconds_per_step"] / old * c["share"] if old else 0.0
        c.setdefault("moved_to", []).append({"cause": "external_load", "s": statistics.median(part)})
        c["evidence"] += (f" ({statistics.median(part) * 1e3:.2f} ms/step of it counted under external_load"
                          + ("" if name == "compute_interference" else
                             f"; measured while outside processes took {used:.2f} of {cores} cores, which also "
                             "delays the collectives: a rank the neighbour deschedules keeps the others waiting") + ")")


def confounded_by_load(causes: list[dict[str, Any]]) -> None:
    """Under an outside load that clearly cost the job, an internal cause smaller than that load is only ``likely``,
    and says so (a cause already only likely gets the same note).

    The phases stay paired, but taking a part of the step away also takes away that part's exposure to the
    neighbour, and a blocking collective turns every descheduling of one rank into a wait for all: under a CPU hog
    here, resnet18's exchange measured 22-31 ms/step against 3-8 ms on the quiet machine. A cause larger than the
    neighbour's whole measured cost is the job's own whatever the load; a smaller one may be the neighbour's doing,
    and the report says to measure again without it.

    The measured wait for a core (``cpu_contention``) confounds only ``compute_interference``, and only when
    outside processes took the cores: that cause is what is left of a slower forward+backward once the wait is
    taken out, and a rank time-shared with a neighbour also computes slower once it runs (its caches refilled
    after each of the neighbour's turns). A clean job beside a bursty busy loop on one core: 14.92 ms/step of
    measured wait and 5.50 ms of slower compute left over, which no change to the job would have removed.
    """
    def clear(name: str) -> dict[str, Any] | None:
        return next((c for c in causes if c["name"] == name and c["verdict"] == "clear"), None)

    ext, cont = clear("external_load"), clear("cpu_contention")
    if cont is not None and not (cont.get("who") or {}).get("outside"):
        cont = None  # the job's own threads oversubscribed the cores: its own cause, no confounder
    for c in causes:
        if c["verdict"] not in ("clear", "likely") or c is ext:
            continue
        larger = [b for b in (ext, cont if c["name"] == "compute_interference" else None)
                  if b is not None and c["seconds_per_step"] < b["seconds_per_step"]]
        if not larger:
            continue
        by = larger[0]
        ms = f"{by['seconds_per_step'] * 1e3:.2f} ms/step"
        what = (f"the outside load's {ms}" if by is ext else
                f"the {ms} the ranks waited for cores that outside processes held")
        c.update(verdict="likely", significant=False, confounded_by=by["name"],
                 evidence=c["evidence"] + f"; smaller than {what}, so it may be the neighbour's doing: measure "
                                          "again without it")


def loader_competes(causes: list[dict[str, Any]], n: int) -> None:
    """An input cost the ranks did not wait for is the loader's CPU competing with the step: ``likely``, not clear.

    Removing the data removes two costs: the time the ranks wait for a batch (measured per step) and the CPU
    the loader takes from the step while it loads ahead. When the measured wait grew by less than half the input
    term from 1 to N, most of it is the second: on shared cores it comes and goes with where the threads land
    (a clean 2-process job here: -1.0 to +0.9 ms/step between repeats), and more loader workers, the usual advice
    for slow input, would take more of the cores.
    """
    c = next((c for c in causes if c["name"] == "input" and c["verdict"] == "clear"), None)
    waited = [w for w in (c or {}).get("waited_per_repeat_s", []) if math.isfinite(w)]
    if c is None or not waited or statistics.median(waited) >= 0.5 * c["seconds_per_step"]:
        return
    w = statistics.median(waited)
    c.update(verdict="likely", significant=False, loader_competes=True, apply_flags={},
             evidence=c["evidence"] + f"; but the ranks waited only {w * 1e3:.2f} ms/step longer for batches at {n} "
             "processes than at 1: the rest is the loader's CPU competing with the step for cores",
             suggestion="give loading cores of its own (processes x --job.threads + loader threads <= cores), or "
                        "make it cheaper (keep samples uint8 until the device); more loader workers would take more")
