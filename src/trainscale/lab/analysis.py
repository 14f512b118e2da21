"""The doctor's arithmetic, as pure functions over run summaries (testable without running anything).

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

Under FSDP no step runs without communication: ``no_comm`` is derived from ``no_data`` less each step's measured
exposed wait in the collectives (``measured_exchange``), and there is no sleep test.

The configurations are the phases of one run (``ablate.phases``), so each difference is paired. Job time of
a phase is its slowest rank's step time (ranks without communication are decoupled): the median over cycles
of each cycle's mean step, steps clipped at 5x the median (``stats.block_step_time``), so that a cost paid
in bursts counts at its mean and a VM's 10-50x hiccup cannot decide it.
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
import statistics
from dataclasses import dataclass
from typing import Any

from ..config import PHASES
from .bottleneck import bottleneck, outside_load
from .invariants import explain_rest, violations, widen_to_point
from .neighbours import describe
from .stats import critical_data_wait, job_step_time, max_rank_gap, median, median_se, rank_gap_se
from .suggest import suggest

__all__ = ["CONFIGS", "CAUSES", "analyse", "op_excess", "COMM_OPS", "external_load", "confounded_by_load",
           "cpu_contention", "measured_exchange"]

CONFIGS: dict[str, list[str]] = {
    "base": [],
    "no_data": ["--ablate.data", "true"],
    "no_comm": ["--ablate.data", "true", "--ablate.comm", "true"],
    "sleep": ["--ablate.data", "true", "--ablate.comm", "true", "--ablate.compute", "sleep"],
}
CAUSES = ("communication", "sync_wait", "input", "compute_interference", "framework_overhead", "slow_operator",
          "straggler", "threads", "external_load", "cpu_contention")
# Profiler rows that are communication or bookkeeping, not a model's operator.
COMM_OPS = ("allreduce", "all_reduce", "broadcast", "gloo", "nccl", "c10d", "distributeddataparallel", "reducer",
            "profilerstep", "barrier", "allgather", "all_gather", "record_param_comms", "[memory]")

Runs = dict[tuple[str, int], list[dict[str, Any]]]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _t(runs: Runs, cfg: str, k: int) -> list[float]:
    return [job_step_time(s) for s in runs.get((cfg, k), [])]


def _se(runs: Runs, cfg: str, k: int, R: int) -> list[float]:
    """Per repeat: the standard error of that run's median step time in ``cfg`` at ``k`` processes."""
    vals = [median_se(s) for s in runs.get((cfg, k), [])][:R]
    return vals + [0.0] * (R - len(vals))


def _term(per_repeat: list[float], sources: list[list[float]]) -> tuple[float, float, float]:
    """(median over repeats, noise, lower bound) of a term measured once per repeat.

    ``sources``: per-repeat standard errors of the medians the term is made of. Each repeat's value has the
    noise 2 x their root-sum-square; the term's noise is the largest of those, and its lower bound is the
    smallest of value - noise over the repeats: above zero only when every repeat shows the term.
    """
    pairs = [(v, 2.0 * math.sqrt(sum(src[i] ** 2 for src in sources if i < len(src))))
             for i, v in enumerate(per_repeat) if math.isfinite(v)]
    if not pairs:
        return float("nan"), float("nan"), float("nan")
    return (statistics.median(v for v, _ in pairs), max(e for _, e in pairs), min(v - e for v, e in pairs))


def op_excess(prof1: dict[str, Any], profn: dict[str, Any]) -> tuple[list[dict[str, Any]], float, float]:
    """Per-operator excess time at N beyond the general slow-down: (rows worst first, general ratio, noise).

    An operator that is just as slow as everything else at N is interference, not a slow operator; the
    general ratio is the time-weighted median of per-operator ratios N/1.
    """
    key = "self_device_s_per_step" if profn.get("device") == "cuda" else "self_s_per_step"

    def ops(p: dict[str, Any]) -> dict[str, float]:
        return {o["name"]: o[key] for o in p.get("ops", []) if not any(c in o["name"].lower() for c in COMM_OPS)}

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


def _cause(name: str, per_repeat: list[float], sources: list[list[float]], loss: float, evidence: str,
           suggestion: str = "", flags: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    value, noise, low = _term(per_repeat, sources)
    return {"name": name, "seconds_per_step": value, "noise_s": noise, "low_s": low,
            "share": value / loss if loss > 0 and math.isfinite(value) else float("nan"),
            "per_repeat_s": per_repeat, "evidence": evidence, "suggestion": suggestion,
            "apply_flags": flags or {}, **extra}


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

    @classmethod
    def of(cls, runs: Runs, n: int, slow_rank: int | None) -> _Terms:
        R = min(len(runs.get((c, k), [])) for c in PHASES for k in (1, n))
        t = {(c, k): _t(runs, c, k)[:R] for c in CONFIGS for k in (1, n)}
        se = {(c, k): _se(runs, c, k, R) for c in CONFIGS for k in (1, n)}
        gap = {c: [max_rank_gap(s.get("rank_compute_s") or [], slow_rank) for s in runs[(c, n)][:R]] for c in PHASES}
        loss_r = [x - y for x, y in zip(t["base", n], t["base", 1])]
        loss, noise, low = _term(loss_r, [se["base", 1], se["base", n]])
        return cls(runs, n, R, t, se, gap, loss_r, loss, noise, low)

    def g(self, phase: str) -> list[float]:
        """The slowest rank's extra compute per repeat, in ``phase`` at N."""
        return [x[0] for x in self.gap[phase]]

    def diff(self, a: str, b: str) -> list[float]:
        """Per repeat: what removing ``b``'s part saves at N minus at 1 ([a - b](N) - [a - b](1))."""
        n = self.n
        return [(self.t[a, n][i] - self.t[b, n][i]) - (self.t[a, 1][i] - self.t[b, 1][i]) for i in range(self.R)]


def _causes(runs: Runs, n: int, ctx: dict[str, Any], profiles: tuple[dict[str, Any], dict[str, Any]] | None,
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
    measured = cpu_contention(causes, {**ctx, "threads": base_n.get("threads")}, n, runs[("base", 1)][:tm.R],
                              runs[("base", n)][:tm.R], tm.se, tm.loss)
    if not measured:  # no run-queue accounting in these runs: the time-sharing model is the last resort
        external_load(causes, ctx, n, base_n, runs[("base", 1)][0], tm.t["no_comm", n])
    return causes, {"loss": tm.loss, "loss_noise": tm.loss_noise, "loss_low": tm.loss_low,
                    "t1": median(tm.t["base", 1]), "tn": median(tm.t["base", n]), "R": tm.R}


def measured_exchange(runs: Runs) -> Runs:
    """``runs`` with a ``no_comm`` configuration where FSDP could not run one: its ``no_data`` steps less each
    step's measured exposed communication (``rank_steps`` column 7, the training thread blocked outside its data
    wait; NaN off CPU counts as none).

    FSDP all-gathers the parameters each unit computes with, so no step runs without communication; what
    removing the exchange would save is what the step waited for it, measured per step. The rows keep their
    cycles, so the bootstrap resamples the derived configuration with the ones it comes from.
    """
    def without_exchange(row: list[float]) -> list[float]:
        exposed = row[7] if len(row) > 7 and math.isfinite(row[7]) else 0.0
        return [row[0], row[1] - exposed, *row[2:]]

    out = dict(runs)
    for (cfg, k), parts in runs.items():
        if cfg == "no_data" and ("no_comm", k) not in runs and parts and parts[0].get("fsdp"):
            out[("no_comm", k)] = [{**p, "rank_steps": [[without_exchange(r) for r in rows]
                                                        for rows in p.get("rank_steps") or []]} for p in parts]
    return out


def _exchange_evidence(base_n: dict[str, Any], t: dict[tuple[str, int], list[float]], n: int) -> str:
    """What the exchange is and what taking it out saves: DDP's all-reduces, or FSDP's measured waits."""
    saved = (f"{_ms(median(t['no_data', n]) - median(t['no_comm', n]))} ms/step at {n} processes vs "
             f"{_ms(median(t['no_data', 1]) - median(t['no_comm', 1]))} ms at 1")
    f = base_n.get("fsdp")
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
    comm_r = [v - (g["no_data"][i] - g["no_comm"][i]) - sync_r[i] for i, v in enumerate(tm.diff("no_data", "no_comm"))]
    base_n = runs[("base", n)][0]
    spread = [f"{x:.0%}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"  # null in JSON: no clock
              for x in runs[("no_data", n)][0].get("rank_compute_spread") or []]
    wait = {k: median(s.get("data_wait_frac") for s in runs[("base", k)]) for k in (1, n)}
    waited_r = [critical_data_wait(b.get("rank_steps") or []) - critical_data_wait(a.get("rank_steps") or [])
                for a, b in zip(runs[("base", 1)][:R], runs[("base", n)][:R])]
    return [
        _cause("input", input_r, [se["base", 1], se["base", n], se["no_data", 1], se["no_data", n]], tm.loss,
               f"data wait {wait[n]:.0%} of the step at {n} processes vs {wait[1]:.0%} at 1; one batch kept on the "
               f"device saves {_ms(median(t['base', n]) - median(t['no_data', n]))} ms/step at {n} vs "
               f"{_ms(median(t['base', 1]) - median(t['no_data', 1]))} ms at 1", *suggest("input", ctx),
               waited_per_repeat_s=waited_r),
        _cause("communication", comm_r, [se["no_data", 1], se["no_data", n], se["no_comm", 1], se["no_comm", n]],
               tm.loss, _exchange_evidence(base_n, t, n), *suggest("communication", ctx)),
        _cause("sync_wait", sync_r, [se["no_data", n]], tm.loss,
               f"each step at {n} processes lasts as long as that step's slowest rank: forward+backward varies from "
               f"step to step (p10-p90 spread per rank: {', '.join(spread)}), so the ranks wait "
               f"{_ms(median(sync_r))} ms/step for each other beyond any rank that is slower on every step (measured "
               "with the exchange on and one batch kept on the device)", *suggest("sync_wait", ctx))]


def _straggler(tm: _Terms, ctx: dict[str, Any]) -> dict[str, Any]:
    """The slowest rank's extra forward+backward in the base phase at N, which every other rank waits for."""
    runs, n, R = tm.runs, tm.n, tm.R
    base_n = runs[("base", n)][0]
    worst = statistics.mode([x[1] for x in tm.gap["base"]]) if tm.gap["base"] else 0
    strag_r = tm.g("base")  # = its compute-side part g[no_comm] + what was moved out of input and communication
    rank_c = [median(s["rank_compute_s"][i] for s in runs[("base", n)][:R])
              for i in range(len(base_n.get("rank_compute_s") or []))]
    strag_se = [rank_gap_se(s, w) for s, (_, w) in zip(runs[("base", n)][:R], tm.gap["base"])]
    return _cause("straggler", strag_r, [strag_se], tm.loss,
                  f"rank {worst} computes {_ms(median(strag_r))} ms/step longer than the median of the others, "
                  f"who wait for it (per-rank forward+backward: {', '.join(f'{c * 1e3:.2f} ms' for c in rank_c)}; "
                  f"{_ms(median(tm.g('no_comm')))} ms without data and communication)",
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
    causes.append(_cause(
        "framework_overhead", fw_r, [tm.se["sleep", 1], tm.se["sleep", n]], tm.loss,
        f"sleep test (every leaf module's compute replaced by a sleep of its duration measured at 1 process): "
        f"{_ms(median(sl1))} ms/step at 1 vs {_ms(median(sln))} ms at {n}", *suggest("framework_overhead", ctx)))
    return [cside_r[i] - fw_r[i] for i in range(R)], True


def _slow_operator(tm: _Terms, ctx: dict[str, Any], profiles: tuple[dict[str, Any], dict[str, Any]],
                   compute_r: list[float]) -> dict[str, Any]:
    """The operator whose time grows most beyond every operator's general slow-down (rank 0's profiles)."""
    rows, ratio, op_noise = op_excess(*profiles)
    top = rows[0] if rows else None
    cap = max(0.0, median(compute_r))
    excess = min(max(0.0, top["excess_s"]), cap) if top else 0.0
    return _cause("slow_operator", [excess] * max(1, tm.R), [[op_noise / 2] * max(1, tm.R)], tm.loss,
                  (f"{top['op']}: {top['s_per_step_1'] * 1e3:.3f} ms/step at 1 vs {top['s_per_step_n'] * 1e3:.3f} "
                   f"ms at {tm.n}, {excess * 1e3:.3f} ms beyond the general x{ratio:.2f} slow-down of all "
                   "operators (rank 0 profiles)") if top else "no operator data",
                  *suggest("slow_operator", {**ctx, "op": top["op"] if top else "?"}),
                  operator=top["op"] if top else None, top_ops=rows[:5])


def _interference(tm: _Terms, ctx: dict[str, Any], compute_r: list[float], slow_s: float, have_sleep: bool
                  ) -> dict[str, Any]:
    """Forward+backward slower at N without data and exchange, beyond the straggler and a slow operator."""
    n, se, runs = tm.n, tm.se, tm.runs
    inter_r = [compute_r[i] - tm.g("no_comm")[i] - slow_s for i in range(tm.R)]
    return _cause(
        "compute_interference", inter_r, [se["no_comm", 1], se["no_comm", n]] +
        ([se["sleep", 1], se["sleep", n]] if have_sleep else []), tm.loss,
        f"forward+backward without data and communication: {_ms(median(tm.t['no_comm', 1]))} ms/step at 1 vs "
        f"{_ms(median(tm.t['no_comm', n]))} ms at {n}"
        + ("" if have_sleep else " (framework overhead not separated: sleep test not run)") +
        f"; threads per process {runs[('base', 1)][0].get('threads')} at 1, {runs[('base', n)][0].get('threads')} "
        f"at {n}", *suggest("compute_interference", ctx), uses_sleep=have_sleep)


def _threads(tm: _Terms, ctx: dict[str, Any], threads: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """What the best other intra-op thread count gains at N (another configuration, not a part of the loss)."""
    n, bn = tm.n, tm.t["base", tm.n]
    best_t, best = min(((t, median(job_step_time(s) for s in ss)) for t, ss in threads.items()), key=lambda x: x[1])
    gain_r = [bn[i] - job_step_time(s) for i, s in enumerate(threads[best_t][:tm.R])]
    return _cause("threads", gain_r, [tm.se["base", n], [median_se(s) for s in threads[best_t][:tm.R]]], tm.loss,
                  f"{n} processes with {best_t} intra-op thread(s) each: {_ms(best)} ms/step vs {_ms(median(bn))} ms "
                  f"with {tm.runs[('base', n)][0].get('threads')}", *suggest("threads", {**ctx, "threads": best_t}),
                  threads=best_t)


# Causes measured inside the phased runs: their intervals come from resampling those runs' cycles.
BOOTSTRAPPED = ("input", "communication", "sync_wait", "straggler", "compute_interference", "external_load",
                "cpu_contention")
# Causes a measured CPU wait hides in, in the order it is taken out of them: a descheduled rank keeps the others
# waiting inside the collective first, then looks like a jittery or slow rank, then like slower compute.
CONTENDED = ("communication", "sync_wait", "straggler", "compute_interference")


def analyse(runs: Runs, n: int, ctx: dict[str, Any], min_share: float = 0.15, min_step_share: float = 0.05,
            profiles: tuple[dict[str, Any], dict[str, Any]] | None = None,
            threads: dict[int, list[dict[str, Any]]] | None = None, replicates: int = 300) -> dict[str, Any]:
    """Split the scaling loss of ``runs`` into ranked causes with intervals and verdicts (see the module docstring).

    ``ctx`` carries what suggestions need (bucket_mb, overlap, workers, slow_rank, strategy fields) and
    ``external``: what else loaded the machine while the runs went (``neighbours.LoadMonitor``).
    """
    from .bootstrap import block_times, bootstrap, interval, outlier_count, verdict

    runs = measured_exchange(runs)
    causes, tot = _causes(block_times(runs), n, ctx, profiles, threads)
    loss, tn = tot["loss"], tot["tn"]
    phased = any(p.get("rank_steps") for parts in runs.values() for p in parts)
    boot: dict[str, list[float]] = {}
    if phased and replicates:
        worst = next(c["rank"] for c in causes if c["name"] == "straggler")

        def estimate(rs: Runs) -> dict[str, float]:
            cs, t = _causes(rs, n, ctx, profiles, threads, worst)
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
    result["invariants"] = violations(result)
    return result


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


def cpu_contention(causes: list[dict[str, Any]], ctx: dict[str, Any], n: int, base_1: list[dict[str, Any]],
                   base_n: list[dict[str, Any]], se: dict[tuple[str, int], list[float]], loss: float) -> bool:
    """Measured CPU contention: the step's critical run-queue wait at N minus at 1, taken out of where it hid.

    Each rank's main thread reports how long it was runnable but not running (schedstat); a synchronous step
    waits for its most descheduled rank (``stats.critical_runq``). What that wait grew by from 1 to N processes
    is this cause. It is taken out of the causes it inflated (``CONTENDED``, then input under an outside load, in
    that order, never below zero) and each move is written in both rows. Who took the CPU: the processes outside the job that the load monitor saw,
    else the job's own threads when processes x threads + loader workers exceed the cores. Returns False (and
    adds nothing) when the runs have no run-queue column.
    """
    # The backend threads' wait inside the exchange is the neighbour's doing only when something outside the job
    # takes cores; otherwise it is the exchange's own demand for them (161 tiny all-reduces keep Gloo's threads
    # runnable), which the exchange's own fix removes, so it stays communication.
    key = "runq_crit_s" if outside_load(ctx) else "runq_main_crit_s"
    r1 = [p.get(key, float("nan")) for p in base_1]
    rn = [p.get(key, float("nan")) for p in base_n]
    if not r1 or len(r1) != len(rn) or not all(math.isfinite(v) for v in r1 + rn):
        return False
    per_repeat = [b - a for a, b in zip(r1, rn)]
    by = {c["name"]: c for c in causes}
    moved: dict[str, list[float]] = {}
    # Under an outside load the measured wait is every thread's, the loader's among them: a batch that came late
    # because its loader thread waited for a core is that wait too (taken last, after what the ranks' waits hid in).
    contended = (*CONTENDED, "input") if outside_load(ctx) else CONTENDED
    stays = _wakeups_stay(by.get("communication"))
    kept = [0.0] * len(per_repeat)  # per repeat, the wait that stays in communication
    for i, v in enumerate(per_repeat):
        left = max(0.0, v)
        for name in contended:
            c = by.get(name)
            if c is None or i >= len(c["per_repeat_s"]):
                continue
            take = min(left, max(0.0, c["per_repeat_s"][i]))
            left -= take
            if name == "communication" and stays:
                kept[i] = take
            else:
                moved.setdefault(name, [0.0] * len(per_repeat))[i] = take
    per_repeat = [v - k for v, k in zip(per_repeat, kept)]
    cause = _cause("cpu_contention", per_repeat, [se["base", 1], se["base", n]], loss,
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
        c, amount = by[name], statistics.median(part)
        if amount <= 0:
            continue
        rest = [v - m for v, m in zip(c["per_repeat_s"], part)]
        old = c["seconds_per_step"]
        c.update(seconds_per_step=statistics.median(rest), per_repeat_s=rest)
        c["share"] = c["seconds_per_step"] / old * c["share"] if old else 0.0
        c.setdefault("moved_to", []).append({"cause": "cpu_contention", "s": amount})
        cause["moved_from"].append({"cause": name, "s": amount})
        c["evidence"] += (f" ({amount * 1e3:.2f} ms/step of it counted under cpu_contention: the ranks' measured "
                          "wait for a free core, which also holds the others up in the exchange)")
    causes.append(cause)
    return True


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
    return {"outside": ext.get("top", [])[:5],  # the load monitor lists only processes over its min_cores
            "outside_cores": ext.get("cores") or 0.0, "job_threads": demand, "cores": cores,
            "oversubscribed": bool(cores and demand > cores)}


def _contention_evidence(ctx: dict[str, Any], n: int, r1: list[float], rn: list[float]) -> str:
    w = _who(ctx, n)
    by = ", ".join(describe(p) for p in w["outside"])
    own = (f"the job runs {w['job_threads']} compute threads ({n} processes x (intra-op threads + loader workers)) "
           f"on {w['cores']} cores")
    return (f"the most descheduled rank's threads waited for a core {median(rn) * 1e3:.2f} ms/step at {n} "
            f"processes vs {median(r1) * 1e3:.2f} ms at 1 (schedstat run-queue time of the main thread, and of the "
            "backend's inside the exposed exchange); "
            + (f"outside the job: {by}; " if by else "no outside process used the CPU; ") + own)


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
    return ("the ranks wait for a core though nothing else seems to run: check the cores this job may use "
            "(taskset -p, the container's CPU quota)", {})
