"""The doctor's measured accounting on hand-made per-step rows with known answers: what bounds the step, CPU
contention taken out of where it hid, and the honesty rules (``lab.invariants``)."""

from __future__ import annotations

import pytest

from trainscale.lab.analysis import analyse
from trainscale.lab.bottleneck import bottleneck, step_shares
from trainscale.lab.invariants import violations
from trainscale.lab.stats import arrivals_behind, critical_runq

CTX = {"bucket_mb": 25.0, "overlap": True, "workers": 0, "batch_size": 32, "slow_rank": -1, "sample_delay_ms": 0,
       "strategy_fields": [], "data_fields": ["workers", "prefetch"]}


def rows(step, wait=0.0, compute=None, runq=0.0, comm=0.0, arrival=None, steps=16, cycles=4, jitter=0.0):
    """One rank's rows (config.STEP_ROW): cycle, step, compute, data wait, runq main, runq all, cpu, comm, arrival."""
    out = []
    for i in range(steps):
        j = jitter * ((i * 7) % 5 - 2) / 2  # deterministic, zero-mean wobble
        t = step + j
        out.append([i // (steps // cycles), t, compute if compute is not None else t - wait - comm, wait, runq, runq,
                    t - runq, comm, (arrival or 0.0) + i * step])
    return out


def part(rank_rows, batch=32):
    t = rank_rows[0][0][1]
    return {"step_time_s": t, "rank_step_time_s": [r[0][1] for r in rank_rows],
            "rank_compute_s": [r[0][2] for r in rank_rows], "measured_steps": len(rank_rows[0]),
            "step_time_spread": 0.01, "samples_per_s": batch * len(rank_rows) / t, "global_batch": batch * len(rank_rows),
            "data_wait_frac": rank_rows[0][0][3] / t, "allreduce_calls_per_step": 1, "bucket_mb": 25.0,
            "overlap": True, "threads": 1, "rank_steps": rank_rows}


def test_a_job_that_waits_for_input_at_every_scale_is_told_so():
    # The slow-collate job: 83% of the step waiting for data at 2 processes, 92% at 1, efficiency ~100%.
    at_n = [part([rows(0.024, wait=0.020), rows(0.024, wait=0.020)])]
    at_1 = [part([rows(0.022, wait=0.0202)])]
    b = bottleneck(at_n, at_1, 2, CTX)
    assert b["name"] == "input" and b["share"] == pytest.approx(0.020 / 0.024)
    assert b["shares_at_1"]["input"] > 0.9 and sum(b["shares"].values()) == pytest.approx(1.0)
    assert "--data.workers" in b["advice"] and b["apply_flags"] == {"data.workers": "2"}


def test_the_exchanges_advice_is_sized_by_the_measured_bytes():
    # 60% of the step in the exchange, 340 KB of gradients per step: latency-bound, so not compression (which
    # cost 26% here on such a job) but fewer exchanges; the advice used to read "fp16 (0.0 MB ... now)".
    ctx = {**CTX, "strategy_fields": ["compression", "local_sgd_period"]}
    at_n = [part([rows(0.010, comm=0.006), rows(0.010, comm=0.006)])]
    at_n[0]["comm_bytes_per_step"] = 340_000
    b = bottleneck(at_n, [], 2, ctx)
    assert b["name"] == "communication" and b["apply_flags"] == {"strategy.local_sgd_period": "4"}, b["advice"]
    assert "340 KB per step is latency-bound" in b["advice"]
    # Bytes not measured: no compression sized "0.0 MB".
    del at_n[0]["comm_bytes_per_step"]
    assert "compression" not in bottleneck(at_n, [], 2, ctx)["advice"]


def test_the_last_rank_to_arrive_is_waited_for():
    # Rank 1 arrives 3 ms after rank 0 each step; rank 0 spends 3.5 ms of its exposed exchange waiting.
    shares, missing, info = step_shares([rows(0.010, comm=0.0035, arrival=0.0), rows(0.010, comm=0.0005, arrival=0.003)])
    assert missing == [] and info["last_arrivals"] == [0, 16]
    assert shares["waiting_for_peers"] == pytest.approx(0.003 / 0.020)
    assert shares["communication"] == pytest.approx(0.001 / 0.020)


def test_a_rank_waiting_for_a_later_one_is_not_held_up_by_its_own_backend_threads():
    # Rank 0 arrives 10 ms before rank 1 and waits 11 ms in the exchange; its backend threads wait 3 ms for a
    # core meanwhile. The step waits for rank 1 for 10 of those ms, so at most the last 1 ms (the exchange
    # itself) of rank 0's backend wait can have held it up: 0.2 + 1 ms, more than rank 1's 0.2 + 0.5 ms.
    r0 = [[0, 0.016, 0.004, 0.0, 0.0002, 0.0032, 0.004, 0.011, 0.004]]
    r1 = [[0, 0.016, 0.014, 0.0, 0.0002, 0.0007, 0.014, 0.001, 0.014]]
    assert arrivals_behind([r0[0], r1[0]]) == pytest.approx([0.010, 0.0])
    assert critical_runq([r0, r1]) == pytest.approx(0.0012)  # not rank 0's 0.2 + 3 ms
    assert critical_runq([r0, r1], backend=False) == pytest.approx(0.0002)
    no_arrivals = [[r[:8] + [float("nan")] for r in rr] for rr in (r0, r1)]
    assert critical_runq(no_arrivals) == pytest.approx(0.0032)  # without arrivals every exposed wait counts


def test_rows_without_accounting_leave_the_measured_parts_out():
    old = [[[c, 0.01, 0.006, 0.002] for c in range(4)]] * 2  # a summary from before the accounting: four columns
    shares, missing, _ = step_shares(old)
    assert set(missing) == {"cpu_contention", "communication", "waiting_for_peers"}
    assert shares["input"] == pytest.approx(0.2) and shares["compute"] == pytest.approx(0.8)


def phased(n_runq=0.0, comm_n=0.004, repeats=2):
    """Doctor runs whose base phase at 2 processes is slower by ``comm_n`` of exchange wait, of which ``n_runq``
    is a rank's main thread waiting for a core."""
    runs = {}
    for r in range(repeats):
        j = 1e-5 * r
        one = [rows(0.010 + j, runq=0.0001)]
        two = [rows(0.010 + comm_n + j, runq=0.0001 + n_runq, comm=comm_n),
               rows(0.010 + comm_n + j, runq=0.0001, comm=comm_n)]
        quiet2 = [rows(0.010 + j, runq=0.0001), rows(0.010 + j, runq=0.0001)]
        runs.setdefault(("base", 1), []).append(part(one))
        runs.setdefault(("no_data", 1), []).append(part(one))
        runs.setdefault(("no_comm", 1), []).append(part(one))
        runs.setdefault(("base", 2), []).append(part(two, 32))
        runs.setdefault(("no_data", 2), []).append(part(two, 32))
        runs.setdefault(("no_comm", 2), []).append(part(quiet2, 32))
    return runs


def test_measured_cpu_contention_is_taken_out_of_communication():
    # A neighbour on one core: one rank waits 3 ms per step for a core, which every other rank then waits for
    # inside the all-reduce; removing the exchange removes that wait too. The measured run-queue wait says so.
    ext = {"machine_cores": 2, "cores": 1.0, "top": [{"pid": 4242, "name": "sh", "cores": 1.0}]}
    res = analyse(phased(n_runq=0.003), 2, {**CTX, "external": ext}, replicates=60)
    c = {x["name"]: x for x in res["causes"]}
    assert res["causes"][0]["name"] == "cpu_contention" and res["causes"][0]["significant"]
    assert c["cpu_contention"]["seconds_per_step"] == pytest.approx(0.003, abs=2e-4)
    assert c["communication"]["seconds_per_step"] == pytest.approx(0.001, abs=2e-4)
    assert "pid 4242" in c["cpu_contention"]["evidence"] and "4242" in c["cpu_contention"]["suggestion"]
    assert "external_load" not in c  # measured, so the time-sharing model is not used
    assert res["invariants"] == []


def test_the_wait_inside_many_small_all_reduces_stays_with_the_exchange():
    # Tiny buckets beside a neighbour: each of 34 all-reduces per step wakes the ranks, which wait for a core each
    # time. Fusing the buckets removes that wait with or without the neighbour, so it stays communication, with
    # the bucket change as its fix, and both rows say how much.
    ext = {"machine_cores": 2, "cores": 1.0, "top": [{"pid": 4242, "name": "sh", "cores": 1.0}]}
    runs = phased(n_runq=0.003)
    for p in runs[("base", 2)]:
        p["allreduce_calls_per_step"] = 34
    res = analyse(runs, 2, {**CTX, "bucket_mb": 0.0, "external": ext}, replicates=60)
    c = {x["name"]: x for x in res["causes"]}
    assert res["causes"][0]["name"] == "communication" and res["causes"][0]["significant"]
    assert c["communication"]["seconds_per_step"] == pytest.approx(0.004, abs=2e-4)
    assert c["communication"]["apply_flags"] == {"strategy.bucket_mb": "25"}
    assert "including 3.00 ms/step the ranks waited for a core" in c["communication"]["evidence"]
    assert c["cpu_contention"]["seconds_per_step"] == pytest.approx(0.0, abs=2e-4)
    assert c["cpu_contention"]["kept_in_communication_s"] == pytest.approx(0.003, abs=1e-6)
    assert "3.00 ms/step more of the wait was inside the exchange" in c["cpu_contention"]["evidence"]
    assert res["invariants"] == []
    # Buckets already fused: the wait is the neighbour's, named with its pid.
    cpu = {x["name"]: x for x in analyse(phased(n_runq=0.003), 2, {**CTX, "external": ext},
                                         replicates=60)["causes"]}["cpu_contention"]
    assert cpu["seconds_per_step"] == pytest.approx(0.003, abs=2e-4)
    assert "kept_in_communication_s" not in cpu and "pid 4242" in cpu["suggestion"]


def test_under_an_outside_load_a_late_batch_of_a_descheduled_loader_is_contention():
    # Beside a neighbour the measured wait (every thread's) is 5 ms: 4 ms hid in the exchange, 1 ms in batches
    # that came late because the loader's thread waited for a core (the base runs wait 1 ms more for data).
    ext = {"machine_cores": 2, "cores": 1.0, "top": [{"pid": 4242, "name": "sh", "cores": 1.0}]}
    runs = phased(n_runq=0.005)
    for p in runs[("base", 2)]:
        p["rank_steps"] = [rows(0.015, wait=0.001, runq=0.0051, comm=0.004),
                           rows(0.015, wait=0.001, runq=0.0001, comm=0.004)]
        p.update(step_time_s=0.015, rank_step_time_s=[0.015, 0.015], samples_per_s=64 / 0.015,
                 data_wait_frac=0.001 / 0.015)
    c = {x["name"]: x for x in analyse(runs, 2, {**CTX, "external": ext}, replicates=60)["causes"]}
    moved = {m["cause"]: m["s"] for m in c["cpu_contention"]["moved_from"]}
    assert moved == pytest.approx({"communication": 0.004, "input": 0.001}, abs=1e-5)
    assert c["input"]["seconds_per_step"] == pytest.approx(0.0, abs=1e-5)
    # Without an outside load the wait measured is the training thread's, which no loader's lateness is: input stays.
    c = {x["name"]: x for x in analyse(runs, 2, CTX, replicates=60)["causes"]}
    assert [m["cause"] for m in c["cpu_contention"]["moved_from"]] == ["communication"]
    assert c["input"]["seconds_per_step"] == pytest.approx(0.001, abs=1e-5)


def test_without_contention_communication_keeps_its_time():
    res = analyse(phased(n_runq=0.0), 2, CTX, replicates=60)
    c = {x["name"]: x for x in res["causes"]}
    assert res["causes"][0]["name"] == "communication"
    assert c["cpu_contention"]["seconds_per_step"] == pytest.approx(0.0, abs=1e-4)
    assert res["invariants"] == []


FSDP = {"units": 3, "allgather_bytes_per_step": 340_008.0, "reduce_scatter_bytes_per_step": 170_004.0,
        "reshard_after_forward": True}


def test_under_fsdp_the_exchange_is_its_measured_wait_in_collectives():
    # FSDP has no step without communication: no no_comm runs. Its exposed wait (column 7: the training thread
    # blocked outside its data wait) is 4 ms at 2 processes and 0.5 ms at 1; that difference is communication.
    runs = {}
    for r in range(2):
        j = 1e-5 * r
        one = part([rows(0.0105 + j, comm=0.0005)])
        two = part([rows(0.0145 + j, comm=0.004), rows(0.0145 + j, comm=0.004)], 32)
        for cfg in ("base", "no_data"):
            runs.setdefault((cfg, 1), []).append({**one, "fsdp": FSDP})
            runs.setdefault((cfg, 2), []).append({**two, "fsdp": FSDP})
    ctx = {**CTX, "fsdp": True, "reshard_after_forward": True, "fsdp_reduce_dtype": "fp32"}
    res = analyse(runs, 2, ctx, replicates=60)
    c = {x["name"]: x for x in res["causes"]}
    assert res["causes"][0]["name"] == "communication" and res["causes"][0]["significant"]
    assert c["communication"]["seconds_per_step"] == pytest.approx(0.0035, abs=2e-4)
    assert c["compute_interference"]["seconds_per_step"] == pytest.approx(0.0005, abs=2e-4)
    assert "all-gather 0.34 MB and reduce-scatter 0.17 MB" in c["communication"]["evidence"]
    assert c["communication"]["apply_flags"] == {"strategy.reshard_after_forward": "false"}
    assert "framework_overhead" not in c  # the sleep test takes the exchange out too: not run under FSDP
    assert res["invariants"] == []
    # Gathered through backward already: the reduce-scatter in half the bytes is the next change.
    c = {x["name"]: x for x in analyse(runs, 2, {**ctx, "reshard_after_forward": False}, replicates=0)["causes"]}
    assert c["communication"]["apply_flags"] == {"strategy.fsdp_reduce_dtype": "bf16"}


def test_the_rules_catch_a_dishonest_result():
    res = analyse(phased(n_runq=0.003), 2, CTX, replicates=60)
    assert violations(res) == []
    comm = next(c for c in res["causes"] if c["name"] == "communication")
    comm["interval_s"] = [comm["seconds_per_step"] + 0.001, comm["seconds_per_step"] + 0.002]
    cpu = next(c for c in res["causes"] if c["name"] == "cpu_contention")
    cpu["moved_from"] = []
    res["bottleneck"]["shares"]["input"] += 0.5
    res["unexplained_s"] += 0.001
    found = violations(res)
    assert len(found) == 4, found


def test_input_work_that_holds_the_step_counts_though_the_wait_is_short():
    # The slow-collate job as measured: a Python collate in the loader thread holds the interpreter lock, so the
    # loop waits 2% of the step in next() while keeping one batch on the device makes the step 85% shorter.
    base = [part([rows(0.031, wait=0.0006, compute=0.0008), rows(0.031, wait=0.0006, compute=0.0008)])]
    no_data = [part([rows(0.0047), rows(0.0047)])]
    b = bottleneck(base, [], 2, CTX, no_data, None)
    assert b["name"] == "input" and b["share"] == pytest.approx(1 - 0.0047 / 0.031)
    assert b["input_waited_share"] < 0.05 and "interpreter lock" in b["evidence"]
    assert sum(b["shares"].values()) == pytest.approx(1.0)


@pytest.mark.parametrize("device, amp", [("cpu", "none"), ("cuda", "fp16")])
def test_a_compute_bound_step_gets_advice_for_its_device_and_precision(device, amp):
    # Seen on an H200: a GPU job already in fp16 autocast was told its step was "work on the CPU" and to use bf16.
    base = [{**part([rows(0.02), rows(0.02)]), "device": device, "amp": amp}]
    b = bottleneck(base, [], 2, CTX)
    assert b["name"] == "compute"
    assert f"own work on the {'GPU' if device == 'cuda' else 'CPU'}" in b["advice"]
    assert ("--strategy.amp bf16" in b["advice"]) == (amp == "none")
    assert "torch.compile" in b["advice"] and "--batch-size 64" in b["advice"]
    # A CPU without native bf16 (AVX2): emulated bf16 is slower than fp32, so it is not advised.
    base[0]["bf16_native"] = False
    assert "bf16" not in bottleneck(base, [], 2, CTX)["advice"]


def test_the_per_rank_chart_draws_each_phases_own_data_wait():
    # A phase summary carries the whole run's rank_data_wait_s too (a median over every phase, ~0 when the
    # no-data phases dominate); the chart must draw the base phase's own wait (seen on an H200: 79 ms drawn as 0).
    from trainscale.lab.experiments import phase_parts
    from trainscale.lab.ranks import rank_segments

    base = part([rows(0.1, wait=0.06), rows(0.1, wait=0.03)])
    run = {**part([rows(0.02), rows(0.02)]), "rank_data_wait_s": [1e-6, 1e-6], "phases": {"base": base}}
    segs = rank_segments([phase_parts(run)["base"]])
    assert [s["data wait"] for s in segs] == pytest.approx([0.06, 0.03])


def straggler_runs(rq0: float, rq1: float, repeats: int = 2):
    """Rank 1 computes 4 ms longer than rank 0 in every phase at 2 processes (rank 0 waits for it in the exchange);
    in the base and no_data phases the ranks' training threads wait ``rq0`` and ``rq1`` per step for a core."""
    runs = {}
    for r in range(repeats):
        j = 1e-5 * r
        one = part([rows(0.010 + j, runq=0.0001)])
        two = part([rows(0.020 + j, compute=0.010, comm=0.009, runq=rq0),
                    rows(0.020 + j, compute=0.014, comm=0.005, runq=rq1)], 32)
        quiet = part([rows(0.011 + j, compute=0.010, runq=0.0001), rows(0.015 + j, compute=0.014, runq=0.0001)], 32)
        for cfg in ("base", "no_data", "no_comm"):
            runs.setdefault((cfg, 1), []).append(one)
        runs.setdefault(("base", 2), []).append(two)
        runs.setdefault(("no_data", 2), []).append(two)
        runs.setdefault(("no_comm", 2), []).append(quiet)
    return runs


def test_a_wait_for_a_core_takes_from_the_straggler_only_what_its_rank_waited_more():
    # Beside a neighbour both ranks wait 6 ms a step for a core, rank 1 no longer than rank 0: its 4 ms of longer
    # compute is its own (a slower forward), so the wait comes out of the exchange, then the compute interference,
    # never the straggler. When rank 1 waits 3 ms longer than rank 0, at most those 3 ms can be the wait's doing.
    ext = {"machine_cores": 2, "cores": 1.0, "top": [{"pid": 4242, "name": "sh", "cores": 1.0}]}
    c = {x["name"]: x for x in analyse(straggler_runs(0.006, 0.006), 2, {**CTX, "external": ext},
                                       replicates=60)["causes"]}
    assert c["straggler"]["seconds_per_step"] == pytest.approx(0.004, abs=1e-4) and c["straggler"]["rank"] == 1
    assert "straggler" not in {m["cause"] for m in c["cpu_contention"]["moved_from"]}
    c = {x["name"]: x for x in analyse(straggler_runs(0.0045, 0.0075), 2, {**CTX, "external": ext},
                                       replicates=60)["causes"]}
    moved = {m["cause"]: m["s"] for m in c["cpu_contention"]["moved_from"]}
    assert moved["straggler"] == pytest.approx(0.0024, abs=1e-4)  # 7.4 ms of wait: 5 ms from the exchange first
    assert c["straggler"]["seconds_per_step"] == pytest.approx(0.0016, abs=1e-4)


def test_the_wait_is_the_jobs_own_threads_when_nothing_outside_takes_a_core():
    # A shell and the launcher used 0.1 of a core: bystanders. The job's own exchange threads (Gloo, on CPU) held
    # the cores the ranks waited for, and the report says so rather than tell the user to move the shell.
    ext = {"machine_cores": 2, "cores": 0.1, "top": [{"pid": 77, "name": "bash", "cores": 0.1}]}
    runs = phased(n_runq=0.003)
    for p in (p for parts in runs.values() for p in parts):
        p["backend"] = "gloo"
    cpu = {x["name"]: x for x in analyse(runs, 2, {**CTX, "external": ext}, replicates=60)["causes"]}["cpu_contention"]
    assert cpu["who"]["whose"] == "own" and cpu["who"]["outside"] == []
    assert "the job's own" in cpu["evidence"] and "bash" not in cpu["suggestion"]
    assert "exchange threads" in cpu["suggestion"]


def test_input_beyond_its_wait_is_explained_by_the_loader_the_script_has():
    """An untuned Lightning script with DataLoader(num_workers=2): the note spoke of a collate in a loader thread
    the script does not have; with worker processes it names them."""
    from trainscale.lab.bottleneck import _input_note

    assert "worker process(es)" in _input_note(0.10, 0.20, 2) and "collate" not in _input_note(0.10, 0.20, 2)
    assert "Python collate in the loader's thread" in _input_note(0.10, 0.20, 0)
    assert _input_note(0.10, 0.12, 2) == ""  # the wait already shows what removing the input saves
