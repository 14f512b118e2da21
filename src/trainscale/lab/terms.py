"""The telescoping terms of the scaling loss, measured per repeat as causes: pure functions over run summaries.

At each world size k (1 and N) four configurations are timed, each removing one more part of the step:

    base  ->  no_data (--ablate.data)  ->  no_comm (+ --ablate.comm)  ->  sleep (+ --ablate.compute sleep)

so T_base = input + communication + compute + framework at each k, and the scaling loss
L = T_base(N) - T_base(1) splits exactly (the terms telescope) into

    input         = [T_base - T_no_data](N) - [same](1)
    communication = [T_no_data - T_no_comm](N) - [same](1)  -> exchange + sync_wait
    compute       = [T_no_comm - T_sleep](N) - [same](1)   -> straggler + slow_operator + compute_interference
    framework     = T_sleep(N) - T_sleep(1)                (the sleep test)

Synchronous ranks also wait each step for whichever of them is slowest that step (step-to-step jitter: the mean
of the per-step maximum of the ranks' compute minus the slowest rank's mean, ``stats.sync_wait``); that part of
communication is its own cause, ``sync_wait``, since no change to the exchange removes it.
The straggler is the slowest rank's extra compute in the base configuration (the others wait for it); the
part of it that appears only with data or communication on is taken out of those two terms, so the sum holds.

A framework's own collectives outside DDP (the Hugging Face Trainer's gather of each batch's token count, Lightning's
broadcast from rank 0 each step) still run with DDP's exchange off, and each step at N waits in them for its slowest
rank: what they add at N beyond at 1 in ``no_comm`` (``stats.framework_collectives_s``, timed by the injected agent)
moves from compute_interference to communication, so the sum holds; a run of the run API has none.

Under FSDP no step runs without communication: ``no_comm`` is derived from ``no_data`` less each step's measured
exposed wait in the collectives (``measured_exchange``), and there is no sleep test.

The configurations are the phases of one run (``ablate.phases``), so each difference is paired. Job time of
a phase is its slowest rank's step time (ranks without communication are decoupled): the median over cycles
of each cycle's mean step, steps clipped at 5x the median (``stats.block_step_time``), so that a cost paid
in bursts counts at its mean and a VM's 10-50x hiccup cannot decide it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from ..schema import PHASES, Col, cell
from .advice.suggest import suggest
from .causes import Runs, make_cause, ms, term
from .contention import cpu_contention, external_load
from .stats import (
    critical_data_wait,
    framework_collectives_s,
    job_step_time,
    max_rank_gap,
    median,
    median_se,
    rank_gap_se,
)

__all__ = ["CONFIGS", "COMM_OPS", "op_excess", "measure", "measured_exchange"]

CONFIGS: dict[str, list[str]] = {
    "base": [],
    "no_data": ["--ablate.data", "true"],
    "no_comm": ["--ablate.data", "true", "--ablate.comm", "true"],
    "sleep": ["--ablate.data", "true", "--ablate.comm", "true", "--ablate.compute", "sleep"],
}
# Profiler rows that are communication or bookkeeping, not a model's operator.
COMM_OPS = ("allreduce", "all_reduce", "broadcast", "gloo", "nccl", "c10d", "distributeddataparallel", "reducer",
            "profilerstep", "barrier", "allgather", "all_gather", "record_param_comms", "[memory]")


def is_range(op: dict[str, Any]) -> bool:
    """A profiler row that is a range around other work (``record_function``: ``Optimizer.step#Adam.step``,
    ``enumerate(DataLoader)#...``), not an operator: its self time is whatever inside it no operator covers. Under
    Lightning's Trainer the optimizer step's range holds the closure (forward, backward and DDP's wait for the
    exchange), so it grows with the processes for no operator's fault. Rows saved before the profile marked ranges
    are told by the ``#`` that ``record_function`` names carry."""
    return bool(op.get("range")) or "#" in op["name"]


def _t(runs: Runs, cfg: str, k: int) -> list[float]:
    return [job_step_time(s) for s in runs.get((cfg, k), [])]


def _se(runs: Runs, cfg: str, k: int, R: int) -> list[float]:
    """Per repeat: the standard error of that run's median step time in ``cfg`` at ``k`` processes."""
    vals = [median_se(s) for s in runs.get((cfg, k), [])][:R]
    return vals + [0.0] * (R - len(vals))


def op_excess(prof1: dict[str, Any], profn: dict[str, Any]) -> tuple[list[dict[str, Any]], float, float]:
    """Per-operator excess time at N beyond the general slow-down: (rows worst first, general ratio, noise).

    An operator that is just as slow as everything else at N is interference, not a slow operator; the
    general ratio is the time-weighted median of per-operator ratios N/1.
    """
    key = "self_device_s_per_step" if profn.get("device") == "cuda" else "self_s_per_step"

    def ops(p: dict[str, Any]) -> dict[str, float]:
        return {o["name"]: o[key] for o in p.get("ops", [])
                if not any(c in o["name"].lower() for c in COMM_OPS) and not is_range(o)}

    one, many = ops(prof1), ops(profn)
    shared = [n for n in one if n in many and one[n] > 0]
    weighted = sorted(((many[n] / one[n], one[n]) for n in shared), key=lambda x: x[0])
    total = sum(w for _, w in weighted)
    ratio, acc = 1.0, 0.0
    for r, w in weighted:
        acc += w
        if acc >= total / 2:
            ratio = r
            break
    rows: list[dict[str, Any]] = [{"op": n, "s_per_step_1": one.get(n, 0.0), "s_per_step_n": t,
             "excess_s": t - ratio * one.get(n, 0.0)} for n, t in many.items()]
    rows.sort(key=lambda r: -r["excess_s"])
    res = [r["excess_s"] for r in rows]
    mad = statistics.median([abs(x - statistics.median(res)) for x in res]) if res else 0.0
    return rows, ratio, 3.0 * 1.4826 * mad


@dataclass
class _Terms:
    """The per-repeat step times the causes are differences of, their noise, and the scaling loss."""

    runs: Runs
    n: int
    R: int
    t: dict[tuple[str, int], list[float]]  # job step time per repeat, by (configuration, processes)
    se: dict[tuple[str, int], list[float]]  # standard error of each of those medians
    gap: dict[str, list[tuple[float, int]]]  # per phase at N: (slowest rank's extra compute, that rank) per repeat
    loss_r: list[float]
    loss: float
    loss_noise: float
    loss_low: float
    own_r: list[float]  # per repeat: the framework's own collectives at N beyond at 1, with the exchange off

    @classmethod
    def of(cls, runs: Runs, n: int, slow_rank: int | None) -> _Terms:
        R = min(len(runs.get((c, k), [])) for c in PHASES for k in (1, n))
        t = {(c, k): _t(runs, c, k)[:R] for c in CONFIGS for k in (1, n)}
        se = {(c, k): _se(runs, c, k, R) for c in CONFIGS for k in (1, n)}
        gap = {c: [max_rank_gap(s.get("rank_compute_s") or [], slow_rank) for s in runs[(c, n)][:R]] for c in PHASES}
        loss_r = [x - y for x, y in zip(t["base", n], t["base", 1])]
        loss, noise, low = term(loss_r, [se["base", 1], se["base", n]])
        own = {k: [s.get("framework_collectives_s", framework_collectives_s(s)) for s in runs[("no_comm", k)][:R]]
               for k in (1, n)}
        return cls(runs, n, R, t, se, gap, loss_r, loss, noise, low, [a - b for a, b in zip(own[n], own[1])])

    def g(self, phase: str) -> list[float]:
        """The slowest rank's extra compute per repeat, in ``phase`` at N."""
        return [x[0] for x in self.gap[phase]]

    def diff(self, a: str, b: str) -> list[float]:
        """Per repeat: what removing ``b``'s part saves at N minus at 1 ([a - b](N) - [a - b](1))."""
        n = self.n
        return [(self.t[a, n][i] - self.t[b, n][i]) - (self.t[a, 1][i] - self.t[b, 1][i]) for i in range(self.R)]


def measure(runs: Runs, n: int, ctx: dict[str, Any], profiles: tuple[dict[str, Any], dict[str, Any]] | None,
            threads: dict[int, list[dict[str, Any]]] | None, slow_rank: int | None = None
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every cause's size (median over repeats) with its normal-theory noise, and the loss; no verdicts yet.

    ``slow_rank``: measure the straggler as that rank's signed gap (the bootstrap's replicates), not the largest.
    """
    tm = _Terms.of(runs, n, slow_rank)
    base_n = runs[("base", n)][0]
    ctx = {**ctx, "calls": base_n.get("allreduce_calls_per_step"), "bytes": base_n.get("comm_bytes_per_step")}
    causes = _exchange_side(tm, ctx)
    strag = _straggler(tm, ctx)
    compute_r, have_sleep = _framework(tm, ctx, causes)
    slow = _slow_operator(tm, ctx, profiles, compute_r) if profiles else None
    if slow:
        causes.append(slow)
    slow_s = slow["seconds_per_step"] if slow and math.isfinite(slow["seconds_per_step"]) else 0.0
    causes.append(strag)
    causes.append(_interference(tm, ctx, compute_r, slow_s, have_sleep))
    if threads:
        causes.append(_threads(tm, ctx, threads))
    own = {"threads": base_n.get("threads"), "backend": base_n.get("backend"), "device": base_n.get("device")}
    measured = cpu_contention(causes, {**ctx, **own}, n, runs[("base", 1)][:tm.R],
                              runs[("base", n)][:tm.R], tm.se, tm.loss)
    if not measured:  # no run-queue accounting in these runs: the time-sharing model is the last resort
        external_load(causes, ctx, n, base_n, runs[("base", 1)][0], tm.t["no_comm", n])
    return causes, {"loss": tm.loss, "loss_noise": tm.loss_noise, "loss_low": tm.loss_low,
                    "t1": median(tm.t["base", 1]), "tn": median(tm.t["base", n]), "R": tm.R}


def measured_exchange(runs: Runs) -> Runs:
    """``runs`` with a ``no_comm`` configuration where FSDP could not run one: its ``no_data`` steps less each
    step's measured exposed communication (``rank_steps`` column 7, the training thread blocked outside its data
    wait; NaN off CPU counts as none). A script's own FSDP ran its ``no_comm`` phase with the exchange kept: that
    phase is replaced likewise.

    FSDP all-gathers the parameters each unit computes with, so no step runs without communication; what
    removing the exchange would save is what the step waited for it, measured per step. The rows keep their
    cycles, so the bootstrap resamples the derived configuration with the ones it comes from.
    """
    def without_exchange(row: list[float]) -> list[float]:
        exposed = cell(row, Col.COMM_WAIT) if math.isfinite(cell(row, Col.COMM_WAIT)) else 0.0
        return [row[Col.CYCLE], row[Col.STEP] - exposed, *row[Col.COMPUTE:]]

    out = dict(runs)
    for (cfg, k), parts in runs.items():
        if cfg == "no_data" and parts and parts[0].get("fsdp"):
            out[("no_comm", k)] = [{**p, "rank_steps": [[without_exchange(r) for r in rows]
                                                        for rows in p.get("rank_steps") or []]} for p in parts]
    return out


def _exchange_evidence(base_n: dict[str, Any], t: dict[tuple[str, int], list[float]], n: int) -> str:
    """What the exchange is and what taking it out saves: DDP's all-reduces, or FSDP's measured waits."""
    saved = (f"{ms(median(t['no_data', n]) - median(t['no_comm', n]))} ms/step at {n} processes vs "
             f"{ms(median(t['no_data', 1]) - median(t['no_comm', 1]))} ms at 1")
    f = base_n.get("fsdp")
    if base_n.get("injected") and not f:  # a script's own DDP: what its logging data says
        from .advice.script import exchange_text

        return f"{exchange_text(base_n)}; removing gradient exchange saves {saved}"
    if not f:
        return (f"{base_n.get('allreduce_calls_per_step')} all-reduce call(s) per step (bucket_mb "
                f"{base_n.get('bucket_mb')}, overlap {base_n.get('overlap')}); removing gradient exchange saves {saved}")
    return (f"FSDP over {f['units']} unit(s): all-gather {f['allgather_bytes_per_step'] / 1e6:.2f} MB and "
            f"reduce-scatter {f['reduce_scatter_bytes_per_step'] / 1e6:.2f} MB per step and rank (reshard after "
            f"forward {str(f['reshard_after_forward']).lower()}); exposed, measured as the training thread's wait "
            f"in collectives (blocked, outside its data wait): {saved}")


def _exchange_side(tm: _Terms, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """Input, communication and sync_wait: what removing the data, then the exchange, saves at N beyond at 1.

    The straggler's growth from no_comm to base (a slow rank is slower still when loading and communication share
    its cores) is moved out of input and communication into the straggler, so the straggler counts its whole cost
    and the terms still add up to the loss. Ranks that synchronise every step also wait for whichever of them is
    slowest that step: jitter, not the exchange, measured with the exchange on and the data off.
    """
    n, R, se, runs, t = tm.n, tm.R, tm.se, tm.runs, tm.t
    g = {c: tm.g(c) for c in PHASES}
    input_r = [v - (g["base"][i] - g["no_data"][i]) for i, v in enumerate(tm.diff("base", "no_data"))]
    sync_r = [s.get("sync_wait_s", 0.0) for s in runs[("no_data", n)][:R]]
    comm_r = [v - (g["no_data"][i] - g["no_comm"][i]) - sync_r[i] + tm.own_r[i]
              for i, v in enumerate(tm.diff("no_data", "no_comm"))]
    base_n = runs[("base", n)][0]
    spread = [f"{x:.0%}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"  # null in JSON: no clock
              for x in runs[("no_data", n)][0].get("rank_compute_spread") or []]
    wait = {k: median(s.get("data_wait_frac") for s in runs[("base", k)]) for k in (1, n)}
    waited_r = [critical_data_wait(b.get("rank_steps") or []) - critical_data_wait(a.get("rank_steps") or [])
                for a, b in zip(runs[("base", 1)][:R], runs[("base", n)][:R])]
    return [
        make_cause("input", input_r, [se["base", 1], se["base", n], se["no_data", 1], se["no_data", n]], tm.loss,
                   f"data wait {wait[n]:.0%} of the step at {n} processes vs {wait[1]:.0%} at 1; one batch kept on the "
                   f"device saves {ms(median(t['base', n]) - median(t['no_data', n]))} ms/step at {n} vs "
                   f"{ms(median(t['base', 1]) - median(t['no_data', 1]))} ms at 1", *suggest("input", ctx),
                   waited_per_repeat_s=waited_r),
        make_cause("communication", comm_r, [se["no_data", 1], se["no_data", n], se["no_comm", 1], se["no_comm", n]],
                   tm.loss, _exchange_evidence(base_n, t, n) + _own_evidence(tm), *suggest("communication", ctx),
                   **_own_fields(tm)),
        make_cause("sync_wait", sync_r, [se["no_data", n]], tm.loss,
                   f"each step at {n} processes lasts as long as that step's slowest rank: forward+backward varies from "
                   f"step to step (p10-p90 spread per rank: {', '.join(spread)}), so the ranks wait "
                   f"{ms(median(sync_r))} ms/step for each other beyond any rank that is slower on every step (measured "
                   "with the exchange on and one batch kept on the device)", *suggest("sync_wait", ctx))]


def _own_calls(tm: _Terms) -> float:
    """The framework's own collectives outside DDP a step at N with the exchange off (rank 0's calls; 0: none)."""
    calls = [s.get("framework_collective_calls_per_step") for s in tm.runs[("no_comm", tm.n)][:tm.R]]
    return median([c for c in calls if isinstance(c, (int, float)) and math.isfinite(c)] or [0.0])


def _own_fields(tm: _Terms) -> dict[str, Any]:
    """The communication cause's record of the framework's own collectives outside DDP (none: no field)."""
    if not _own_calls(tm):
        return {}
    by = (tm.runs[("base", tm.n)][0].get("framework_collectives") or {}).get("calls_per_step") or {}
    return {"framework_collectives": {"calls_per_step": _own_calls(tm), "by_function": by,
                                      "s_per_step": median(tm.own_r), "per_repeat_s": tm.own_r}}


def _own_evidence(tm: _Terms) -> str:
    """What the framework's own collectives outside DDP cost the step at N, which DDP's switch does not remove."""
    if not _own_calls(tm):
        return ""
    by = _own_fields(tm)["framework_collectives"]["by_function"]
    names = ", ".join(f"{k} x{v:.2g}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])) or "n/a"
    sites = (tm.runs[("base", tm.n)][0].get("framework_collectives") or {}).get("sites") or []
    lines = "; ".join(f"{s['function']} from {s['where']} `{s['code']}`" for s in sites if s["where"])
    return (f"; with the exchange off the framework's own collectives outside DDP still run ({names} a step"
            + (f"; {lines}" if lines else "") + f"): {ms(median(tm.own_r))} ms/step more at {tm.n} processes "
            "than at 1, the wait for each step's slowest rank included (counted here, not as compute)")


def _straggler(tm: _Terms, ctx: dict[str, Any]) -> dict[str, Any]:
    """The slowest rank's extra forward+backward in the base phase at N, which every other rank waits for."""
    runs, n, R = tm.runs, tm.n, tm.R
    base_n = runs[("base", n)][0]
    worst = statistics.mode([x[1] for x in tm.gap["base"]]) if tm.gap["base"] else 0
    strag_r = tm.g("base")  # = its compute-side part g[no_comm] + what was moved out of input and communication
    rank_c = [median(s["rank_compute_s"][i] for s in runs[("base", n)][:R])
              for i in range(len(base_n.get("rank_compute_s") or []))]
    strag_se = [rank_gap_se(s, w) for s, (_, w) in zip(runs[("base", n)][:R], tm.gap["base"])]
    return make_cause("straggler", strag_r, [strag_se], tm.loss,
                      f"rank {worst} computes {ms(median(strag_r))} ms/step longer than the median of the others, "
                      f"who wait for it (per-rank forward+backward: {', '.join(f'{c * 1e3:.2f} ms' for c in rank_c)}; "
                      f"{ms(median(tm.g('no_comm')))} ms without data and communication)",
                      *suggest("straggler", {**ctx, "rank": worst}), rank=worst)


def _framework(tm: _Terms, ctx: dict[str, Any], causes: list[dict[str, Any]]) -> tuple[list[float], bool]:
    """The sleep test's framework overhead (appended to ``causes`` when it ran); returns (compute-side rest per
    repeat, whether the sleep test ran)."""
    n, R, t = tm.n, tm.R, tm.t
    cside_r = [t["no_comm", n][i] - t["no_comm", 1][i] for i in range(R)]
    sl1, sln = t["sleep", 1], t["sleep", n]
    if not (len(sl1) == R and len(sln) == R and R > 0):
        return cside_r, False
    fw_r = [sln[i] - sl1[i] for i in range(R)]
    causes.append(make_cause(
        "framework_overhead", fw_r, [tm.se["sleep", 1], tm.se["sleep", n]], tm.loss,
        f"sleep test (every leaf module's compute replaced by a sleep of its duration measured at 1 process): "
        f"{ms(median(sl1))} ms/step at 1 vs {ms(median(sln))} ms at {n}", *suggest("framework_overhead", ctx)))
    return [cside_r[i] - fw_r[i] for i in range(R)], True


def _slow_operator(tm: _Terms, ctx: dict[str, Any], profiles: tuple[dict[str, Any], dict[str, Any]],
                   compute_r: list[float]) -> dict[str, Any]:
    """The operator whose time grows most beyond every operator's general slow-down (rank 0's profiles)."""
    rows, ratio, op_noise = op_excess(*profiles)
    top = rows[0] if rows else None
    cap = max(0.0, median(compute_r))
    excess = min(max(0.0, top["excess_s"]), cap) if top else 0.0
    return make_cause("slow_operator", [excess] * max(1, tm.R), [[op_noise / 2] * max(1, tm.R)], tm.loss,
                      (f"{top['op']}: {top['s_per_step_1'] * 1e3:.3f} ms/step at 1 vs {top['s_per_step_n'] * 1e3:.3f} "
                       f"ms at {tm.n}, {excess * 1e3:.3f} ms beyond the general x{ratio:.2f} slow-down of all "
                       "operators (rank 0 profiles)") if top else "no operator data",
                      *suggest("slow_operator", {**ctx, "op": top["op"] if top else "?"}),
                      operator=top["op"] if top else None, top_ops=rows[:5])


def _interference(tm: _Terms, ctx: dict[str, Any], compute_r: list[float], slow_s: float, have_sleep: bool
                  ) -> dict[str, Any]:
    """Forward+backward slower at N without data and exchange, beyond the straggler and a slow operator."""
    n, se, runs = tm.n, tm.se, tm.runs
    inter_r = [compute_r[i] - tm.g("no_comm")[i] - slow_s - tm.own_r[i] for i in range(tm.R)]
    return make_cause(
        "compute_interference", inter_r, [se["no_comm", 1], se["no_comm", n]] +
        ([se["sleep", 1], se["sleep", n]] if have_sleep else []), tm.loss,
        f"forward+backward without data and communication: {ms(median(tm.t['no_comm', 1]))} ms/step at 1 vs "
        f"{ms(median(tm.t['no_comm', n]))} ms at {n}"
        + ("" if have_sleep else " (framework overhead not separated: sleep test not run)") +
        f"; threads per process {runs[('base', 1)][0].get('threads')} at 1, {runs[('base', n)][0].get('threads')} "
        f"at {n}" + (f"; {ms(median(tm.own_r))} ms/step of it is the framework's own collectives outside DDP, counted "
                     "under communication" if _own_calls(tm) else ""),
        *suggest("compute_interference", ctx), uses_sleep=have_sleep)


def _threads(tm: _Terms, ctx: dict[str, Any], threads: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """What the best other intra-op thread count gains at N (another configuration, not a part of the loss)."""
    n, bn = tm.n, tm.t["base", tm.n]
    best_t, best = min(((t, median(job_step_time(s) for s in ss)) for t, ss in threads.items()), key=lambda x: x[1])
    gain_r = [bn[i] - job_step_time(s) for i, s in enumerate(threads[best_t][:tm.R])]
    return make_cause("threads", gain_r, [tm.se["base", n], [median_se(s) for s in threads[best_t][:tm.R]]], tm.loss,
                      f"{n} processes with {best_t} intra-op thread(s) each: {ms(best)} ms/step vs {ms(median(bn))} ms "
                      f"with {tm.runs[('base', n)][0].get('threads')}", *suggest("threads", {**ctx, "threads": best_t}),
                      threads=best_t)
