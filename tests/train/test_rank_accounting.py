"""The per-rank time accounting's parts on this process: the schedstat reader, the thread classes, the clocks."""

from __future__ import annotations

import hashlib
import math
import os
import random
import statistics
import subprocess
import threading
import time

import pytest

from trainscale.data.loader import PREFETCH_THREAD
from trainscale.strategies.comm import CommMeter
from trainscale.train.instruments.accounting import BLOCK, READ_EVERY_S, Accounting
from trainscale.train.instruments.clocks import estimate_offset, measure_offset
from trainscale.train.instruments.schedstat import TaskStat, ThreadSet, available, classify_thread

pytestmark = pytest.mark.skipif(available() is not None, reason=f"no schedstat here: {available()}")

BLOB = b"x" * (4 << 20)  # hashlib releases the GIL on large inputs: the threads below compete for a CPU, not the GIL


class Spinner(threading.Thread):
    """A thread that hashes until stopped (always runnable), optionally pinned to one CPU."""

    def __init__(self, cpu: int | None = None, name: str = "spinner"):
        super().__init__(name=name, daemon=True)
        self.cpu, self.stop, self.ready = cpu, threading.Event(), threading.Event()

    def run(self) -> None:
        if self.cpu is not None:
            os.sched_setaffinity(0, {self.cpu})  # 0: this thread only
        self.ready.set()
        while not self.stop.is_set():
            hashlib.sha256(BLOB).digest()


def _watch(thread: Spinner, seconds: float) -> tuple[float, float, float]:
    """(on-CPU s, run-queue s, wall s) of ``thread`` over ``seconds``."""
    thread.ready.wait(10)
    stat = TaskStat(f"/proc/self/task/{thread.native_id}/schedstat", "other", True)
    t0 = time.perf_counter()
    time.sleep(seconds)
    cpu, runq = stat.delta()
    wall = time.perf_counter() - t0
    stat.close()
    return cpu * 1e-9, runq * 1e-9, wall


def test_a_busy_thread_accumulates_cpu_and_is_always_running_or_waiting():
    t = Spinner()
    t.start()
    try:
        cpu, runq, wall = _watch(t, 0.5)
    finally:
        t.stop.set()
        t.join(10)
    assert cpu > 0.05
    # Runnable the whole time: every nanosecond is either on a CPU or waiting on a run queue.
    assert cpu + runq >= 0.8 * wall


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity on this system")
def test_a_thread_sharing_one_core_with_two_busy_threads_waits_on_the_run_queue():
    core = min(os.sched_getaffinity(0))
    threads = [Spinner(core) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        cpu, runq, wall = _watch(threads[0], 0.6)
    finally:
        for t in threads:
            t.stop.set()
        for t in threads:
            t.join(10)
    # Three always-runnable threads on one core: each runs about a third of the time and waits the rest.
    assert runq >= 0.3 * wall
    assert runq > cpu


def test_threads_are_classified_by_who_started_them():
    python = {11: PREFETCH_THREAD, 12: "trainscale-watchdog", 13: "tracker"}
    assert classify_thread(10, 10, python) == "main"
    assert classify_thread(11, 10, python) == "loader"
    assert classify_thread(12, 10, python) == "other"
    assert classify_thread(13, 10, python) == "other"
    assert classify_thread(99, 10, python) == "backend"  # Python did not start it: Gloo, NCCL, the intra-op pool


def test_thread_set_finds_this_process_loader_watchdog_native_and_worker_threads():
    import torch
    torch.set_num_threads(2)
    torch.ones(256, 256) @ torch.ones(256, 256)  # starts the intra-op pool's native thread
    loader, dog = Spinner(name=PREFETCH_THREAD), Spinner(name="trainscale-watchdog")
    for t in (loader, dog):
        t.start()
        t.ready.wait(10)
    child = subprocess.Popen(["sleep", "30"])  # forked from the main thread, like the DataLoader's workers
    try:
        ts = ThreadSet(threading.get_native_id())
        ts.rescan()
        time.sleep(0.2)
        per = ts.read()
        assert ts.counts["loader"] >= 1 and ts.counts["other"] >= 1
        # >= 1: inside the suite this process also has earlier tests' children (the count was 103 there).
        assert ts.counts["backend"] >= 1 and ts.counts["workers"] >= 1
        assert per["loader"][0] > 0 and per["other"][0] > 0  # both spin: on-CPU time in 0.2 s
        ts.close()
    finally:
        child.kill()
        child.wait()
        for t in (loader, dog):
            t.stop.set()
            t.join(10)


def test_accounting_rows_spread_each_block_of_other_threads_evenly():
    acct = Accounting(0, None, True, 0.0, 0.0)
    acct.schedule(warm=2, block=3)
    acct.loop_starts(time.perf_counter())
    t = Spinner()  # another thread of this process that burns CPU: it shows in cpu_all, not in the training thread
    t.start()
    try:
        for step in range(1, 12):
            t_prev = time.perf_counter()
            acct.step_called(t_prev + 0.001)
            time.sleep(0.01)
            acct.step_done(step, step > 2, t_prev)
        acct.end()
    finally:
        t.stop.set()
        t.join(10)
    rows = [acct.row(i, 0.0, 0.0) for i in range(9)]
    assert len(rows) == 9 and all(len(r) == 5 for r in rows)
    for block in (rows[0:3], rows[3:6], rows[6:9]):
        others = [r[1] - r[0] for r in block]  # runq_crit - runq_main: the backend threads' share
        assert max(others) - min(others) <= 1e-9  # one block, one share per step
    assert all(r[0] >= 0 and r[1] >= r[0] and r[2] > 0 for r in rows)
    rep = acct.report()
    assert rep["cpu_s"]["other"] > 5 * rep["cpu_s"]["main"]  # the spinner's CPU is the other threads'
    # The rows and the per-class means account for the same time.
    assert sum(r[2] for r in rows) == pytest.approx(9 * sum(rep["cpu_s"].values()), rel=1e-6)
    assert sum(r[0] for r in rows) == pytest.approx(9 * rep["runq_s"]["main"], rel=1e-6)
    acct.schedule(warm=0, block=0)  # no phase plan: the default block
    assert acct.block == BLOCK


def test_short_steps_are_read_together_and_their_time_spread_evenly(monkeypatch):
    """A read of schedstat between two steps costs the step far more than its own time: steps shorter than
    READ_EVERY_S share one read (spread evenly over them), longer ones are read one by one."""
    acct = Accounting(0, None, True, 0.0, 0.0)
    acct.schedule(warm=0, block=1000)  # no block ends inside: only the time decides
    reads = []
    real = acct._read_main
    monkeypatch.setattr(acct, "_read_main", lambda: reads.append(1) or real())
    t0 = time.perf_counter()
    acct.loop_starts(t0)
    for step in range(1, 41):  # 40 steps of about 1 ms of CPU
        t_prev = time.perf_counter()
        end = t_prev + 0.001
        while time.perf_counter() < end:
            pass
        acct.step_done(step, True, t_prev)
    short_reads, elapsed = len(reads) - 1, time.perf_counter() - t0  # - 1: the re-base at the loop's start
    for step in range(41, 46):  # 5 steps of 2 x READ_EVERY_S
        t_prev = time.perf_counter()
        time.sleep(2 * READ_EVERY_S)
        acct.step_done(step, True, t_prev)
    acct.end()
    assert 2 <= short_reads <= min(20, elapsed / READ_EVERY_S + 1), (short_reads, elapsed)  # one per 10 ms, not 40
    assert len(reads) - 1 - short_reads >= 5  # long steps: one read each (and the last block's)
    rows = [acct.row(i, 0.0, 0.0) for i in range(45)]
    # The rows and the per-class means account for the same time (cpu_all_s: the training thread and the others).
    assert sum(r[2] for r in rows) == pytest.approx(45 * sum(acct.report()["cpu_s"].values()), rel=1e-6)
    cpu = [r[2] for r in rows[:40]]
    assert all(c > 0 for c in cpu) and 0.5e-3 < statistics.median(cpu) < 3e-3  # each holds about its own 1 ms


def test_under_fsdp_the_exposed_wait_is_the_blocked_time_outside_the_data_wait():
    meter = CommMeter()
    meter.blocked_is_exposed = True  # as FSDP's strategy sets it: no gradient seam to time from
    acct = Accounting(0, meter, True, 0.0, 0.0)
    acct.schedule(warm=1, block=2)
    acct.loop_starts(time.perf_counter())
    steps = []
    t_prev = time.perf_counter()
    for step in range(1, 6):  # step 1 is warm-up, as in a run: the reads start from its end
        time.sleep(0.004)  # "waiting for data"
        sum(i * i for i in range(20_000))  # on CPU: not communication
        time.sleep(0.012)  # "waiting in a collective"
        acct.step_done(step, step > 1, t_prev)
        now = time.perf_counter()
        steps.append(now - t_prev)
        t_prev = now
    acct.end()
    steps = steps[1:]
    rows = [acct.row(i, steps[i], 0.004) for i in range(4)]
    # 12 ms blocked beyond the data wait. Sleeps overshoot; on a busy machine the thread then waits for a core
    # after waking, which is its run-queue wait (row[0]), not the collective's: the two together hold the 12 ms.
    comm = [r[3] for r in rows]
    assert all(0.010 <= r[3] + r[0] and r[3] <= 0.012 + 0.010 for r in rows), (comm, [r[0] for r in rows])
    assert Accounting(0, CommMeter(), True, 0.0, 0.0).comm_blocked is False  # DDP: its gradient hooks time it


def test_offset_estimate_lies_within_its_bound_of_the_truth():
    rng = random.Random(0)
    truth = 123.456
    samples = []
    for _ in range(10):
        t1 = rng.uniform(0, 100)
        there, back = rng.expovariate(1e4), rng.expovariate(1e3)  # asymmetric legs
        samples.append((t1, t1 + there + truth, t1 + there + back))
    offset, bound = estimate_offset(samples)
    assert abs(offset - truth) <= bound
    assert bound == pytest.approx(min(s[2] - s[0] for s in samples) / 2)


def test_offset_measured_through_a_real_store_on_one_clock_is_zero_within_its_bound():
    import torch.distributed as dist
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False)
    got: dict[int, tuple[float, float]] = {}

    def rank(r: int, store: dist.Store) -> None:  # different clock names force the ping-pong
        got[r] = measure_offset(store, r, 2, "test/clock", clock=f"clock{r}")

    threads = [threading.Thread(target=rank, args=(r, s)) for r, s in ((0, server), (1, client))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    offset, bound = got[1]
    assert got[0] == (0.0, 0.0)
    assert 0 < bound < 1.0
    assert abs(offset) <= bound  # one process, one clock: the true offset is 0
    # Ranks on one clock do not ping at all.
    assert measure_offset(server, 0, 1, "test/one") == (0.0, 0.0)


def test_rows_without_accounting_keep_nine_columns_and_arrivals_count_from_rank0_loop_start():
    from trainscale.config import STEP_ROW
    from trainscale.train.instruments.accounting import NAN_ROW
    from trainscale.train.instruments.phases import local_phase_stats, merge_phase_stats
    marks, steps, waits, compute, cycles = ["base", "base"], [0.2, 0.3], [0.01, 0.02], [0.1, 0.1], [0, 0]
    off = local_phase_stats(marks, steps, waits, compute, cycles, [list(NAN_ROW)] * 2)
    on = local_phase_stats(marks, steps, waits, compute, cycles, [[0.0, 0.1, 0.2, 0.01, 100.5]] * 2)
    merged = merge_phase_stats([off, on], global_batch=8, origin=100.0)["base"]["rank_steps"]
    assert [len(r) for rows in merged for r in rows] == [len(STEP_ROW)] * 4 == [9] * 4
    assert all(math.isnan(x) for x in merged[0][0][4:])
    assert merged[1][0][8] == pytest.approx(0.5) and merged[1][0][:4] == [0, 0.2, 0.1, 0.01]
    assert on["base"][7][0][8] == 100.5  # the rank's own rows are left as they were


def test_cores_are_the_ranks_affinity_on_rank0_host_capped_by_the_cgroup_quota(tmp_path):
    from trainscale.train.instruments.accounting_summary import cgroup_cores, job_cores, merge_accounting
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cores(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cores(tmp_path) == math.inf
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cores(v1) == 3.0
    rep = lambda rank, host, aff, quota=None: {"rank": rank, "host": host, "affinity": aff, "quota": quota,
                                              "reason": None, "offset": 0.0, "bound": 0.0, "pid": 1,
                                              "threads": {}, "cpu_s": {}, "runq_s": {}}
    assert job_cores([rep(0, "a", [0, 1]), rep(1, "a", [2, 3]), rep(2, "b", [0, 1, 2, 3, 4])]) == 4
    assert job_cores([rep(0, "a", [0, 1, 2, 3], 2.5), rep(1, "a", [0, 1, 2, 3])]) == 3
    down = merge_accounting([rep(0, "a", [0]), {**rep(1, "a", [1]), "reason": "no /proc"}])
    assert down["method"] == "unavailable" and down["reason"] == "rank 1: no /proc" and down["ranks"] == []


def test_a_threads_cpu_quota_hold_is_read_from_its_own_cgroup_v1_or_v2(tmp_path):
    """The live monitor adds a rank's quota throttling to its wait for a CPU: read from the cgroup the thread is
    in now (the fault benchmark moves a rank into a quota'd cgroup mid-run), in v1's ns or v2's us."""
    from trainscale.train.instruments.accounting_summary import cgroup_throttled
    proc, v1, v2 = tmp_path / "proc", tmp_path / "v1", tmp_path / "v2"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("9:memory:/m\n3:cpu,cpuacct:/job/rank1\n1:name=systemd:/\n0::/\n")
    (v1 / "cpu" / "job" / "rank1").mkdir(parents=True)
    (v1 / "cpu" / "job" / "rank1" / "cpu.stat").write_text("nr_periods 40\nnr_throttled 12\nthrottled_time 2500000000\n")
    assert cgroup_throttled(7, v1, proc) == ("/job/rank1", 2.5)
    (proc / "7" / "cgroup").write_text("0::/kubepods/pod1\n")
    (v2 / "kubepods" / "pod1").mkdir(parents=True)
    (v2 / "kubepods" / "pod1" / "cpu.stat").write_text("usage_usec 900\nnr_throttled 3\nthrottled_usec 1500\n")
    assert cgroup_throttled(7, v2, proc) == ("/kubepods/pod1", 0.0015)
    assert cgroup_throttled(8, v2, proc) is None  # no such thread
    assert cgroup_throttled(7, v1, proc) is None  # its cgroup has no cpu.stat there
