"""The doctor's statistics on synthetic runs with known answers: heavy tails, regime switches, outliers."""

from __future__ import annotations

import random
import statistics

from trainscale.lab.analysis import analyse
from trainscale.lab.bootstrap import interval, resample_runs, verdict
from trainscale.lab.stats import sync_wait

PHASES = ("base", "no_data", "no_comm")


def run(k: int, cost: dict[str, float], rng: random.Random, cycles: int = 6, block: int = 5, tail: float = 0.0,
        switch: bool = False, ranks: int = 2, loader: bool = False) -> dict[tuple[str, int], dict]:
    """A phased run: each step = its phase's cost x a regime factor (two modes, switching between cycles when
    ``switch``) x log-normal noise, plus a heavy-tailed outlier with probability ``tail``."""
    parts = {}
    for ph in PHASES:
        # The rank waits for its batch for the part of the step that the data costs (``loader``: it does not, the
        # loader's CPU slows the step instead).
        waits = 0.0 if loader or ph != "base" else (cost["base"] - cost["no_data"]) / cost["base"]
        per_rank = []
        for _ in range(ranks):
            rows = []
            for c in range(cycles):
                regime = 2.0 if switch and c % 2 else 1.0  # the VM's slow mode, whole cycles at a time
                for _ in range(block):
                    t = cost[ph] * regime * rng.lognormvariate(0, 0.15)
                    if rng.random() < tail:
                        t *= 10 + 40 * rng.random()
                    rows.append([c, t, 0.6 * t, waits * t])
            per_rank.append(rows)
        meds = [sorted(r[1] for r in rows)[len(rows) // 2] for rows in per_rank]
        parts[(ph, k)] = {"step_time_s": meds[0], "step_time_spread": 0.5, "measured_steps": len(per_rank[0]),
                          "samples_per_s": 32 / meds[0], "rank_step_time_s": meds,
                          "rank_compute_s": [0.6 * m for m in meds], "rank_steps": per_rank,
                          "rank_compute_spread": [0.5] * ranks, "data_wait_frac": 0.1, "threads": 1,
                          "allreduce_calls_per_step": 1, "bucket_mb": 25.0, "overlap": True}
    return parts


def runs_for(cost1, costn, repeats=2, seed=0, **kw):
    rng = random.Random(seed)
    out: dict = {}
    for _ in range(repeats):
        for k, cost in ((1, cost1), (2, costn)):
            for key, part in run(k, cost, rng, **kw).items():
                out.setdefault(key, []).append(part)
    return out


CTX = {"bucket_mb": 25.0, "overlap": True, "workers": 0, "slow_rank": -1, "sample_delay_ms": 0.0}
ONE = {"base": 0.010, "no_data": 0.010, "no_comm": 0.010}
INPUT_N = {"base": 0.016, "no_data": 0.010, "no_comm": 0.010}  # 6 ms/step of input at N, nothing else


def causes(res):
    return {c["name"]: c for c in res["causes"]}


def test_a_planted_input_cause_is_clear_with_heavy_tails_and_regime_switches():
    for kw in ({}, {"tail": 0.05}, {"switch": True}, {"tail": 0.05, "switch": True}):
        res = analyse(runs_for(ONE, INPUT_N, **kw), 2, CTX, replicates=200)
        c = causes(res)
        assert res["causes"][0]["name"] == "input" and c["input"]["verdict"] == "clear", (kw, res["causes"][:2])
        lo, hi = c["input"]["interval_s"]
        v = c["input"]["seconds_per_step"]
        # 6 ms planted (12 ms in the slow mode's cycles). Tails scale with the step here (10-50x of it), so they
        # add to the slower phase's mean: clipped at 5x they can at most double the estimate; unclipped, a 50x step
        # would decide it. Without tails the estimate is the planted cost.
        planted = 0.009 if kw.get("switch") else 0.006  # the slow mode doubles it in half the cycles
        bound = 2.2 * planted if kw.get("tail") else (0.0132 if kw.get("switch") else 0.0075)
        assert lo > 0.003 and 0.0048 < v < bound, (kw, v, lo)
        assert c["communication"]["verdict"] in ("no", "undecided")  # no planted exchange cost


def test_a_cost_paid_in_bursts_counts_at_its_mean():
    """A shared disk under load: at N, one step in three waits 3x as long (the median step does not see it)."""
    rng = random.Random(5)
    runs = runs_for(ONE, ONE, seed=5)
    for part in runs[("base", 2)]:
        for rows in part["rank_steps"]:
            for i, r in enumerate(rows):
                if i % 3 == 2:
                    r[1] = 0.030 * rng.lognormvariate(0, 0.1)  # ~3x the 10 ms step
                    r[3] = r[1] - 0.010  # waiting for the disk
    res = causes(analyse(runs, 2, CTX, replicates=200))
    # Mean cost per step at N: (2 x 10 + 30) / 3 - 10 = 6.7 ms; the median step would say 0.
    assert res["input"]["verdict"] == "clear" and 0.004 < res["input"]["seconds_per_step"] < 0.009, res["input"]


def test_an_input_cost_the_ranks_did_not_wait_for_is_the_loader_competing_for_cores():
    """Removing the data saves 6 ms/step at N, but no rank waited for a batch: the loader's CPU slowed the step."""
    res = causes(analyse(runs_for(ONE, INPUT_N, loader=True), 2, CTX, replicates=200))
    c = res["input"]
    assert c["verdict"] == "likely" and c["loader_competes"] and not c["apply_flags"], c
    assert "competing with the step for cores" in c["evidence"] and "--data.workers" not in c["suggestion"]


def test_a_clean_job_gets_no_clear_cause():
    res = analyse(runs_for(ONE, ONE, tail=0.05, switch=True, seed=3), 2, CTX, replicates=200)
    assert not [c["name"] for c in res["causes"] if c["verdict"] == "clear"], res["causes"]
    assert res["statistics"]["outlier_steps"] > 0  # counted and reported, not silently averaged in


def test_resampling_keeps_pairs_and_draws_whole_cycles():
    runs = runs_for(ONE, INPUT_N, repeats=1)
    rs = resample_runs(runs, random.Random(1))
    base, nodata = rs[("base", 2)][0], rs[("no_data", 2)][0]
    assert base["rank_step_time_s"] != runs[("base", 2)][0]["rank_step_time_s"]  # something was resampled
    assert base["rank_steps"] is runs[("base", 2)][0]["rank_steps"]  # the raw rows are kept, medians recomputed
    assert nodata["rank_step_time_s"][0] < base["rank_step_time_s"][0]  # the pairing holds within a replicate


def test_interval_and_verdict_words():
    lo, hi, p = interval([float(v) for v in range(-10, 91)])
    assert (lo, hi, p) == (-5.0, 85.0, 90 / 101)
    assert verdict(1.0, 0.2, 1.0, 0.1) == "clear"
    assert verdict(1.0, -0.2, 0.85, 0.1) == "likely"
    assert verdict(1.0, -0.5, 0.6, 0.1) == "undecided"
    assert verdict(0.05, 0.01, 1.0, 0.1) == "no"


def test_a_neighbour_that_takes_the_jobs_cores_is_named_with_its_pid():
    slow_compute = {"base": 0.016, "no_data": 0.016, "no_comm": 0.016}  # everything at N slower: contention
    ctx = {**CTX, "external": {"cores": 0.95, "machine_cores": 2, "top": [{"pid": 4242, "name": "hog", "cores": 0.95}]}}
    res = analyse(runs_for(ONE, slow_compute), 2, ctx, replicates=200)
    top = res["causes"][0]
    assert top["name"] == "external_load" and top["verdict"] == "clear" and "pid 4242" in top["evidence"]
    # Time-sharing 2 job threads + 0.95 outside cores on 2 cores stretches compute up to 1.475x: 16 ms x (1 - 1/1.475)
    # = 5.15 ms is the neighbour's; the rest of the 6 ms stays compute interference (not counted twice).
    assert abs(top["seconds_per_step"] - 0.00515) < 0.001
    assert abs(causes(res)["compute_interference"]["seconds_per_step"] + top["seconds_per_step"] - 0.006) < 0.001
    assert "outside processes took 0.95 of 2 cores" in causes(res)["communication"]["evidence"]  # said, not hidden
    quiet = analyse(runs_for(ONE, slow_compute), 2, {**CTX, "external": {"cores": 0.0, "machine_cores": 2}},
                    replicates=100)
    assert "external_load" not in causes(quiet)



def test_sync_wait_is_the_mean_of_each_steps_slowest_rank_beyond_the_slowest_rank():
    # Ranks take turns being 4 ms slow: each step lasts 14 ms, each rank averages 12 ms: 2 ms of waiting per step.
    turns = [[[c, 0.0, 0.010 + (0.004 if (i + r) % 2 else 0.0), 0.0] for c in range(3) for i in range(4)]
             for r in range(2)]
    assert abs(sync_wait(turns) - 0.002) < 1e-12
    # One rank slow on every step is a straggler: nobody waits for jitter.
    always = [[[c, 0.0, 0.010 + 0.004 * r, 0.0] for c in range(3) for i in range(4)] for r in range(2)]
    assert abs(sync_wait(always)) < 1e-12
    assert sync_wait(turns[:1]) == 0.0  # one process waits for nobody
    assert abs(sync_wait(turns, {0: 2, 2: 1}) - 0.002) < 1e-12  # a bootstrap replicate: weighted cycles
    assert sync_wait([[[0, 0.0, float("nan"), 0.0]], [[0, 0.0, 0.01, 0.0]]]) == 0.0  # no compute clock: no claim


def _jittery(k: int, rng: random.Random, jitter: float, cycles: int = 6, block: int = 5) -> dict:
    """Phased runs of a job with no exchange cost: at k > 1 the ranks synchronise in base and no_data, where a
    step lasts as long as its slowest rank's compute; each rank's compute jitters (+ uniform 0..``jitter``)."""
    parts = {}
    for ph in PHASES:
        comp = [[0.010 + jitter * rng.random() for _ in range(cycles * block)] for _ in range(k)]
        synced = ph != "no_comm" and k > 1
        per_rank = [[[i // block, (max(c[i] for c in comp) if synced else mine[i]) + 0.002, mine[i], 0.0]
                     for i in range(cycles * block)] for mine in comp]
        meds = [statistics.median(r[1] for r in rows) for rows in per_rank]
        parts[(ph, k)] = {"step_time_s": meds[0], "step_time_spread": 0.3, "measured_steps": cycles * block,
                          "samples_per_s": 32 / meds[0], "rank_step_time_s": meds, "rank_steps": per_rank,
                          "rank_compute_s": [statistics.median(r[2] for r in rows) for rows in per_rank],
                          "rank_compute_spread": [0.4] * k, "data_wait_frac": 0.0, "threads": 1,
                          "allreduce_calls_per_step": 1, "bucket_mb": 25.0, "overlap": True}
    return parts


def test_waiting_for_jitter_is_sync_wait_not_communication():
    rng = random.Random(7)
    runs: dict = {}
    for _ in range(2):
        for k in (1, 2):
            for key, part in _jittery(k, rng, jitter=0.012, cycles=12).items():
                runs.setdefault(key, []).append(part)
    res = causes(analyse(runs, 2, CTX, replicates=200))
    # Two ranks, each 0-12 ms slow at random: the slower of two lasts 2/3 x 12 ms beyond 10 ms, either rank 1/2 x 12:
    # the job waits 12 x (2/3 - 1/2) = 2 ms per step beyond either rank's own mean. No byte is exchanged.
    assert res["sync_wait"]["verdict"] == "clear" and 0.001 < res["sync_wait"]["seconds_per_step"] < 0.003, res
    assert res["communication"]["verdict"] in ("no", "undecided"), res["communication"]
    assert "grad_accum" in res["sync_wait"]["suggestion"]
    runs[("no_data", 2)][0]["rank_compute_spread"] = [None, 0.4]  # NaN is null in a summary read back from JSON
    assert "n/a, 40%" in causes(analyse(runs, 2, CTX, replicates=0))["sync_wait"]["evidence"]


def test_slower_compute_beside_a_neighbour_is_only_likely_while_the_wait_for_a_core_is_larger():
    from trainscale.lab.analysis import confounded_by_load

    def cause(name: str, ms: float, **extra: object) -> dict:
        return {"name": name, "seconds_per_step": ms / 1e3, "verdict": "clear", "significant": True,
                "evidence": "measured", **extra}
    outside = {"outside": [{"pid": 7717, "name": "python", "cores": 0.42}]}
    # A clean job beside a bursty busy loop on one core (the doctor matrix, 2026-11-26): 29.38 ms/step of wait for a
    # core, 5.50 ms of slower forward+backward left over. A planted straggler is per rank: not the neighbour's.
    cs = {c["name"]: c for c in [cause("cpu_contention", 29.38, who=outside), cause("compute_interference", 5.50),
                                 cause("straggler", 9.74)]}
    confounded_by_load(list(cs.values()))
    ci = cs["compute_interference"]
    assert (ci["verdict"], ci["significant"], ci["confounded_by"]) == ("likely", False, "cpu_contention"), ci
    assert "29.38 ms/step" in ci["evidence"] and "measure again without it" in ci["evidence"]
    assert cs["straggler"]["verdict"] == "clear" and cs["cpu_contention"]["verdict"] == "clear"
    # The job's own threads oversubscribing the cores, or slower compute larger than the wait: the job's own.
    for who, wait_ms in (({"outside": []}, 29.38), (outside, 4.0)):
        cs = [cause("cpu_contention", wait_ms, who=who), cause("compute_interference", 5.50)]
        confounded_by_load(cs)
        assert cs[1]["verdict"] == "clear" and "confounded_by" not in cs[1], (who, wait_ms)


def test_under_an_outside_load_a_cause_smaller_than_the_load_is_only_likely():
    ctx = {**CTX, "external": {"cores": 0.95, "machine_cores": 2, "top": [{"pid": 4242, "name": "hog", "cores": 0.95}]}}
    # At N: compute 14 ms, 4 ms more than at 1 (within the 14 x (1 - 1/1.475) = 4.5 ms the neighbour can explain,
    # so all 4 ms are its: 4/14 of the compute's time), the exchange 5 ms, input 7 ms.
    loaded = {"base": 0.026, "no_data": 0.019, "no_comm": 0.014}
    res = causes(analyse(runs_for(ONE, loaded), 2, ctx, replicates=200))
    ext = res["external_load"]
    assert ext["verdict"] == "clear"
    # The exchange is the same ranks' threads: the neighbour took the same 4/14 of it (1.43 ms).
    assert abs(ext["seconds_per_step"] - (0.004 + 0.005 * 4 / 14)) < 0.0005, ext
    assert "ms of communication" in ext["evidence"]
    assert res["input"]["verdict"] == "clear"  # larger than the load: the job's own, load or not
    comm = res["communication"]
    assert abs(comm["seconds_per_step"] - 0.005 * 10 / 14) < 0.0005
    assert comm["verdict"] == "likely" and comm["confounded_by"] == "external_load", comm
    assert "measure again without it" in comm["evidence"]
    quiet = causes(analyse(runs_for(ONE, loaded), 2, CTX, replicates=200))
    assert quiet["communication"]["verdict"] == "clear"  # the same numbers without a neighbour
    assert abs(quiet["communication"]["seconds_per_step"] - 0.005) < 0.0005
