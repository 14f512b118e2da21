"""The per-rank time accounting's cost on the step: ``log.accounting`` on against off, 2 processes, same job.

The doctor's kind of run: the default job (an MLP on digits), ``--ablate.phases base,no_data,no_comm`` in
blocks of 8 steps, 2 processes under ``trainscale launch``. Two comparisons, both alternating on and off in
ABBA order so that drift and a slow spell of the shared machine fall on both:

1. **Inside one run** (the result): a loop on the run API switches the run's accounting on and off every
   chunk of 24 steps (one pass through the three phases; the run's accounting switched out of the
   instruments' hooks and back, ``Instruments.switch``, and re-based with ``resume()`` when it comes back,
   outside the chunk's time: a run
   re-bases once, at its start). A
   chunk's step time is its mean, every step counted (the per-block reads land on single steps, which a
   median would hide), each step capped at twice the chunk's median (a pause of the shared machine is not
   the accounting's); ``overhead_ratio`` is the median over the ABBA groups (on, off, off, on) of the
   group's on time over its off time, ``ratio_ci90`` its 90% bootstrap interval, ``ratio_p10``/``ratio_p90`` the
   spread of single groups. A group, not an adjacent pair: in each arm one chunk follows a switch and one does
   not, and a linear drift falls on both alike (pairs of adjacent chunks put the switch on one side of each pair,
   which made the median of pair ratios 1.0137 with every seam a no-op).
   ``cpu_ratio``: the same for the training thread's CPU seconds per step (``time.thread_time``), which a
   wait for the CPU does not inflate: on a machine shared with other work it resolves what the wall clock
   cannot, and on a quiet one the step's overhead is this added CPU time on its critical path.
2. **Whole runs** (``trainscale train``'s Trainer with ``--log.accounting true/false``) in the same process
   group: the same ratio over pairs of runs, whose run-to-run noise on a shared machine is far larger.

Then, in the same processes, the cost of each read timed in a loop: the training thread's schedstat, one
block's reads of the other threads, the thread-list rescan; ``expected_ratio_from_reads`` is what they would
add to the step at that cost (between two steps a read costs several times more). Last line: one JSON object
with ``overhead_ratio``.
Run: python benchmarks/doctor_accounting.py [--chunks 300 --pairs 4 --device auto]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

JOB = ["--log.progress", "none", "--data.eval_size", "0", "--log.metrics", "false", "--log.skip_first", "3",
       "--ablate.phases", "base,no_data,no_comm", "--ablate.phase_steps", "8"]
CHUNK = 24  # steps per on or off chunk: one pass through the three phases
CLIP = 2.0


def mean_step_s(summary: dict) -> float:
    """Mean seconds per measured step, every step counted (a block's reads land on one step)."""
    return summary["global_batch"] / summary["samples_per_s"]


def clipped_mean(times: list[float]) -> float:
    """Mean step time with each step capped at ``CLIP`` x the median: a block's reads (tens of us) count in full,
    a pause of the shared machine (tens of ms) counts as a slow step, not as ten."""
    cap = CLIP * statistics.median(times)
    return statistics.fmean(min(t, cap) for t in times)


def toggled_chunks(chunks: int, job: list[str] = JOB, instrument: str = "accounting",
                   side: Callable[[], float] | None = None, switch: bool = True) -> dict[str, list[float]]:
    """Per chunk of one run whose ``instrument`` (an attribute of the run's instruments) is on in chunks 0, 3, 4,
    7, 8, ... (ABBA; in every chunk without ``switch``): mean step seconds (``on``, ``off``) and the training
    thread's CPU seconds per step (``cpu_on``, ``cpu_off``); with ``side`` (a clock of CPU seconds, such as a side
    thread's), its seconds per step too (``side_on``, ``side_off``)."""
    import trainscale
    from trainscale.data import build_datasets
    from trainscale.models import build_model
    from trainscale.models.losses import resolve_loss
    from trainscale.train.trainer import build_optimizer

    steps = 3 + chunks * CHUNK
    run = trainscale.init(args=job + ["--job.steps", str(steps)])
    cfg = run.cfg
    train, _, info = build_datasets(cfg.data)
    model = build_model(cfg.model.name, info.in_shape, info.num_classes, cfg.model.width, cfg.model.depth)
    model, opt, loader = run.prepare(model, build_optimizer(model.parameters(), cfg), train, data_info=info)
    loss_fn = resolve_loss(cfg.job.loss)
    ins = run.instruments
    assert ins is not None and getattr(ins, instrument) is not None
    tool = getattr(ins, instrument)
    on = True
    out: dict[str, list[float]] = {"on": [], "off": [], "cpu_on": [], "cpu_off": [], "side_on": [], "side_off": []}
    times: list[float] = []
    t_prev = cpu0 = side0 = 0.0
    for x, y in run.batches(loader, steps=steps):
        run.forward_backward(x, y, loss_fn)
        run.step()
        now = time.perf_counter()
        k = run.step_count - 3  # steps after warm-up
        if k > 0:
            times.append(now - t_prev)
        if k >= 0 and k % CHUNK == 0:
            if times:
                mode = "on" if on else "off"
                out[mode].append(clipped_mean(times))
                out[f"cpu_{mode}"].append((time.thread_time() - cpu0) / len(times))
                if side is not None:
                    out[f"side_{mode}"].append((side() - side0) / len(times))
            was, on = on, (k // CHUNK) % 4 in (0, 3) or not switch
            if on and not was and hasattr(tool, "resume"):
                tool.resume()  # the accounting's readings restart: what the threads did while off is not counted
            ins.switch(tool, on)
            times, cpu0, side0 = [], time.thread_time(), side() if side is not None else 0.0
            now = time.perf_counter()  # the switch is the benchmark's, not a step's (a run re-bases once)
        t_prev = now
    ins.switch(tool, True)
    run.finish()
    return out


def read_costs(n: int = 3000) -> dict[str, float]:
    """Microseconds per read, on this rank's live threads (Gloo's, the intra-op pool's, the watchdog's), each timed
    in a loop: a read's cost when it falls between two steps is several times more (the accounting's docstring)."""
    from trainscale.train.instruments.accounting import Accounting

    acct = Accounting(0, None, True, 0.0, 0.0)
    acct.schedule(0, 10**9)  # no block closes inside the step timing below
    acct.loop_starts(time.perf_counter())
    t0 = time.perf_counter()
    for i in range(n):
        acct.step_done(i + 1, True, 0.0)
    step_us = (time.perf_counter() - t0) / n * 1e6  # the bookkeeping (a read every READ_EVERY_S of it)
    t0 = time.perf_counter()
    for _ in range(n):
        acct._read_main()
    main_us = (time.perf_counter() - t0) / n * 1e6
    others = acct.others
    assert others is not None
    t0 = time.perf_counter()
    for _ in range(n):
        others.rescan()
    rescan_us = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for _ in range(n):
        others.read()
    read_us = (time.perf_counter() - t0) / n * 1e6
    threads = len(others.tasks)
    acct.end()
    return {"step_us": step_us, "main_read_us": main_us, "block_read_us": read_us, "rescan_us": rescan_us,
            "thread_read_us": read_us / max(1, threads), "other_threads": threads}


def per_step_us(c: dict[str, float], step_s: float) -> float:
    """What the reads cost a step of ``step_s`` in a run, at their in-loop cost: the bookkeeping, the training
    thread's read (every ``READ_EVERY_S``, at least once a block), a block's reads and rescans."""
    from trainscale.train.instruments.accounting import BLOCK, READ_EVERY_S, RESCAN

    main_reads = max(1 / BLOCK, min(1.0, step_s / READ_EVERY_S))
    return c["step_us"] + c["main_read_us"] * main_reads + c["block_read_us"] / BLOCK + c["rescan_us"] / (BLOCK * RESCAN)


def worker(chunks: int, pairs: int, device: str, out: str) -> None:
    import json

    from trainscale.config import load_config
    from trainscale.distributed import init_distributed
    from trainscale.train.trainer import Trainer

    job = JOB + ["--job.device", device]
    base = job + ["--job.steps", str(3 + 12 * CHUNK)]
    init_distributed(load_config(base).job)  # one process group and thread setting for every run
    inside = toggled_chunks(chunks, job)
    runs: dict[str, list[float]] = {"on": [], "off": []}
    for p in range(pairs):
        for mode in (("on", "off") if p % 2 == 0 else ("off", "on")):  # ABBA: neither always runs first
            cfg = load_config(base + ["--log.accounting", "true" if mode == "on" else "false"])
            runs[mode].append(mean_step_s(Trainer(cfg).fit()))
    if int(os.environ["RANK"]) == 0:
        import torch
        dev = torch.cuda.get_device_name() if torch.cuda.is_available() and device != "cpu" else "cpu"
        Path(out).write_text(json.dumps({"inside": inside, "runs": runs, "costs": read_costs(), "device": dev}))


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def pair_ratios(r: dict[str, list[float]]) -> list[float]:
    """On over off of each adjacent pair (whole runs, alternated ABBA)."""
    return [on / off for on, off in zip(r["on"], r["off"])]


def group_ratios(r: dict[str, list[float]]) -> list[float]:
    """On over off of each ABBA group of chunks: ``on`` holds chunks 0, 3, 4, 7, ..., ``off`` 1, 2, 5, 6, ..., so
    group g is on[2g] + on[2g+1] against off[2g] + off[2g+1] (an incomplete last group is left out)."""
    n = min(len(r["on"]), len(r["off"])) // 2
    return [(r["on"][2 * g] + r["on"][2 * g + 1]) / (r["off"][2 * g] + r["off"][2 * g + 1]) for g in range(n)]


def median_interval(values: list[float], draws: int = 2000) -> tuple[float, float]:
    """90% bootstrap interval of the median of ``values`` (resampled with replacement)."""
    import random
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return meds[int(0.05 * draws)], meds[int(0.95 * draws) - 1]


def summary(r: dict[str, list[float]], label: str, groups: bool = True) -> dict[str, float]:
    """Median on/off ratio over ABBA groups (``groups``) or adjacent pairs, with its 90% interval, the
    10th-90th percentile spread of single ratios, and the ratio of the pooled means."""
    ratios = group_ratios(r) if groups else pair_ratios(r)
    if not groups and len(ratios) <= 20:
        for i, (on, off, q) in enumerate(zip(r["on"], r["off"], ratios)):
            print(f"{label} pair {i + 1}: on {on * 1e3:.3f} ms, off {off * 1e3:.3f} ms per step, ratio {q:.4f}",
                  file=sys.stderr)
    lo, hi = median_interval(ratios)
    print(f"{label}: {len(ratios)} {'ABBA groups' if groups else 'pairs'}, median on {statistics.median(r['on']) * 1e3:.3f} ms, off "
          f"{statistics.median(r['off']) * 1e3:.3f} ms per step; ratio {statistics.median(ratios):.4f} "
          f"(90% interval {lo:.4f}-{hi:.4f})", file=sys.stderr)
    return {"ratio": statistics.median(ratios), "lo": lo, "hi": hi,
            "p10": quantile(ratios, 0.1), "p90": quantile(ratios, 0.9),
            "pooled": statistics.fmean(r["on"]) / statistics.fmean(r["off"]), "pairs": len(ratios),
            "step_off_s": statistics.median(r["off"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--chunks", type=int, default=300, help="chunks of 24 steps in the toggled run (half of them on)")
    ap.add_argument("--pairs", type=int, default=4, help="pairs of whole runs, on and off")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                    help="the job's --job.device (auto: CUDA where there is one, the two ranks sharing it)")
    ap.add_argument("--worker-out")
    a = ap.parse_args()
    if a.worker_out:
        worker(a.chunks, a.pairs, a.device, a.worker_out)
        return
    from _common import emit, launch_self

    r = launch_self(__file__, ["--chunks", str(a.chunks), "--pairs", str(a.pairs), "--device", a.device])
    inside, runs, c = summary(r["inside"], "chunk"), summary(r["runs"], "run", groups=False), r["costs"]
    cpu = summary({"on": r["inside"]["cpu_on"], "off": r["inside"]["cpu_off"]}, "cpu")
    c["per_step_us"] = per_step_us(c, inside["step_off_s"])
    print(f"reads (in a loop): bookkeeping {c['step_us']:.2f} us/step, training thread {c['main_read_us']:.1f} "
          f"us/read; other threads ({c['other_threads']}) {c['block_read_us']:.1f} us/block ({c['thread_read_us']:.1f}"
          f" us each), rescan {c['rescan_us']:.1f} us; {c['per_step_us']:.1f} us per step in all", file=sys.stderr)
    expected = 1 + c["per_step_us"] * 1e-6 / inside["step_off_s"]
    result: dict[str, Any] = {
        "overhead_ratio": inside["ratio"], "ratio_ci90": [inside["lo"], inside["hi"]],
        "ratio_p10": inside["p10"], "ratio_p90": inside["p90"],
        "pooled_ratio": inside["pooled"], "chunk_pairs": inside["pairs"], "step_off_s": inside["step_off_s"],
        "cpu_ratio": cpu["ratio"], "cpu_ratio_ci90": [cpu["lo"], cpu["hi"]], "cpu_off_s": cpu["step_off_s"],
        "run_pairs_ratio": runs["ratio"], "run_pairs_p10": runs["p10"], "run_pairs_p90": runs["p90"],
        "run_pairs": runs["pairs"], "expected_ratio_from_reads": expected, "device": r["device"], **c}
    emit(result)


if __name__ == "__main__":
    main()
