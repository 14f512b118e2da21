"""A labelled fault benchmark: does the live straggler monitor, the hang report or the launcher name the faulty rank
and the kind of fault, and how soon?

Each run is a short CPU/Gloo job of 2 (``--max-nproc`` up to 4) processes, ``_fault_job.py`` on the run API
under ``trainscale launch``, with none or one fault (``TRAINSCALE_BENCH_FAULT``) on a random rank from a random
step (a seeded RNG). The faults and the truth each is scored against:

| fault | truth | what must say it |
| --- | --- | --- |
| ``sleep``: a sleep in the rank's forward | compute | the monitor: an episode of that rank, cause ``compute`` |
| ``gc``: ``gc.collect()`` calls in its forward | compute | the same |
| ``data``: a sleep in its loader's collate | data | an episode of that rank, cause ``data`` |
| ``neighbour``: CPU-bound processes pinned to its core | cpu_contention | an episode, cause ``cpu_contention`` |
| ``quota``: a cgroup v1 CPU quota (where writable) | cpu_contention | the same |
| ``stop``: SIGSTOP | hang | the hang report: that rank stopped, with a collective (``last collective #N``) |
| ``kill``: SIGKILL | failed | the launcher: ``rank R failed`` |
| ``skip``: it skips a metric all-reduce | mismatch | the launcher: ``mismatched collective``, that rank (Gloo aborts) |
| ``shape``: it gives that all-reduce another shape | mismatch | the same |

Clean runs come in proportion (one after every three injected). A monitor's answer is its first episode of the
faulty rank detected at or after the onset step (else its first episode of another rank: wrong); episodes of other
ranks after the onset are counted in ``other_rank_episodes``, episodes before it in ``early_episodes``. An
episode of the right rank whose cause is ``unknown`` ("cause unknown") is counted in ``unknown``, not as wrong,
and left out of ``accuracy``'s denominator. A clean run with any episode, hang report or failure is a false
alarm (``false_alarms`` lists them: on a shared machine most are real CPU contention from its other work). For a mismatch the report lists every
rank's collective; the rank it names is the one whose collective differs from the others' (with two ranks: from
the metric all-reduce, ``all_reduce [[3]]``, that the job's code makes there). Detection: steps from the onset
to ``detected_at_step``, and seconds from the onset (the faulty rank's clock) to the warning line's arrival;
hangs: seconds to the report, against ``job.timeout_s`` + 10. ``overhead_ratio`` is ``straggler_monitor.py``'s
same-run on/off measurement (its toggled run, ``--overhead-chunks`` chunks of 24 steps) made in this invocation.

Each slow fault's ``effect`` is how much it slowed the job, by the job's own clock: the faulty rank's median step
time after the onset over its median before (``median_effect`` per kind). A fault the monitor missed while the job
slowed is a miss of the monitor, not a fault too mild to matter.

With ``--windows`` each run's line in ``--out`` also holds every window the monitor scored, which
``straggler_replay.py`` replays through the detector with other settings, without running the jobs again.

Every run has a timeout and runs in a session of its own; every process seen under it is killed at its end.
SIGTERM or Ctrl-C lets the run under way end, then prints the summary of the runs done (``stopped_early``).

Last line: one JSON object (``runs``, ``accuracy``, ``wilson_low``/``wilson_high``, ``false_alarm_rate``,
``median_detection_steps``, ``median_detection_s``, ``overhead_ratio``, ``unknown``, ...).
Run: python benchmarks/campaigns/fault_localisation.py --runs 6 [--seed 0 --out runs.jsonl --max-nproc 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JOB = HERE / "_fault_job.py"
CGROUP = "/sys/fs/cgroup/cpu/trainscale-fault-bench"
STEPS = 80
EVERY = 5  # log.straggler_every
TIMEOUT_S = 6.0  # job.timeout_s
RUN_TIMEOUT_S = 90.0
TRUTH = {"sleep": "compute", "gc": "compute", "data": "data", "neighbour": "cpu_contention",
         "quota": "cpu_contention", "stop": "hang", "kill": "failed", "skip": "mismatch", "shape": "mismatch"}
SLOW = {"sleep", "gc", "data", "neighbour", "quota"}


def amount(kind: str, rng: random.Random) -> float:
    """How hard the fault hits (the base job's time before the exchange is about 1-3 ms a step)."""
    return {"sleep": lambda: rng.uniform(0.004, 0.015), "gc": lambda: rng.randint(1, 3),
            "data": lambda: rng.uniform(0.01, 0.03), "neighbour": lambda: rng.randint(1, 2),
            "quota": lambda: rng.choice([0.2, 0.3, 0.4])}.get(kind, lambda: 0)()


@dataclass
class Run:
    i: int
    kind: str  # "" for a clean run
    nproc: int
    rank: int = -1
    step: int = 0
    amount: float = 0.0
    truth: str = "clean"
    # what was said
    said: str = ""  # compute / data / cpu_contention / unknown / hang / failed / mismatch / "" (nothing)
    said_rank: list[int] = field(default_factory=list)
    collective: str = ""  # the hang report's collective, where it names one
    detected_at_step: int | None = None
    detection_steps: int | None = None
    detection_s: float | None = None
    early: int = 0  # episodes detected before the onset
    other: int = 0  # episodes of other ranks detected after the onset
    episodes: list[dict[str, Any]] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)  # straggler, hang and failure lines
    rc: int | None = None
    wall_s: float = 0.0
    timed_out: bool = False
    left: int = 0
    outside_cores: float = 0.0  # CPU the machine spent outside the job while it ran, in cores
    effect: float | None = None  # how much the fault slowed the job's step, by the job's own clock (slow kinds)
    verdict: str = ""  # right / wrong / unknown / missed / clean / false_alarm
    windows: list[Any] | None = None  # with --windows: every window rank 0's detector scored, for a replay


# ---- one run
def run_job(r: Run, timeout_s: float, extra: list[str], windows: bool = False) -> None:
    import psutil

    from trainscale.lab.neighbours import LoadMonitor

    with tempfile.TemporaryDirectory() as d:
        # The jobs run in a temporary directory: they import this tree's package, whatever PYTHONPATH held.
        path = os.pathsep.join([str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "TRAINSCALE_JSON": f"{d}/s.json",
               "TRAINSCALE_BENCH_ONSET": f"{d}/onset", "TRAINSCALE_BENCH_TIMES": d,
               "TRAINSCALE_BENCH_FAULT": f"{r.kind}:{r.rank}:{r.step}:{r.amount}" if r.kind else "",
               "TRAINSCALE_BENCH_WINDOWS": f"{d}/windows.jsonl" if windows else ""}
        env.pop("RANK", None)
        cmd = [sys.executable, "-m", "trainscale", "launch", "--nproc-per-node", str(r.nproc), str(JOB),
               "--steps", str(STEPS), "--log.straggler_every", str(EVERY), "--job.timeout_s", str(TIMEOUT_S),
               "--log.progress", "none", "--log.metrics", "false", "--data.eval_size", "0", *extra]
        # Other work on the machine slows ranks in ways no fault planted here explains: the cores it took are kept.
        with LoadMonitor() as load:
            t0 = time.monotonic()
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                 start_new_session=True, cwd=d)
            lines: list[tuple[float, str]] = []
            reader = threading.Thread(target=lambda: lines.extend((time.time(), ln.rstrip()) for ln in p.stdout),  # type: ignore[union-attr]
                                      daemon=True)
            reader.start()
            seen: set[Any] = set()
            try:
                while p.poll() is None:
                    try:
                        seen |= set(psutil.Process(p.pid).children(recursive=True))
                    except psutil.Error:
                        pass
                    if time.monotonic() - t0 > timeout_s:
                        r.timed_out = True
                        break
                    time.sleep(0.2)
            finally:  # a timeout, an interrupt or SIGTERM: nothing of the job outlives it
                r.left = end_all(p, seen)
            reader.join(timeout=5)
        r.rc, r.wall_s = p.returncode, round(time.monotonic() - t0, 2)
        r.outside_cores = round(load.report()["cores"], 2)
        onset = float(Path(f"{d}/onset").read_text()) if Path(f"{d}/onset").exists() else None
        summary = json.loads(Path(f"{d}/s.json").read_text()) if Path(f"{d}/s.json").exists() else None
        judge(r, lines, onset, summary)
        if windows and Path(d, "windows.jsonl").exists():
            r.windows = [json.loads(line) for line in Path(d, "windows.jsonl").read_text().splitlines()]
        if r.kind in SLOW:
            mine = Path(d, f"steps.{r.rank}.json")
            r.effect = effect(r.step, json.loads(mine.read_text())) if mine.exists() else None


def effect(onset: int, steps: list[float]) -> float:
    """How much a fault from step ``onset`` slowed the job: the median step time from the step after the onset over
    the median of steps 5 to the one before it (start-up and the onset step left out)."""
    return round(statistics.median(steps[onset:]) / statistics.median(steps[4:onset - 1]), 3)


def end_all(p: subprocess.Popen, seen: set[Any]) -> int:
    """Kill the job's session and every process seen under it; return how many were still alive at its end."""
    import psutil

    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    time.sleep(0.3)
    left = 0
    for q in seen:
        try:
            if q.is_running() and q.status() != psutil.STATUS_ZOMBIE:
                left += 1
                q.kill()
        except psutil.Error:
            pass
    return left


STRAGGLER = re.compile(r"straggler: rank (\d+) \(.*?\) slow since step (\d+): ([\d.]+)x .*\((likely (.+)|cause unknown)\)")
FAILED = re.compile(r"rank (\d+) failed: (.*)")
MISMATCH = re.compile(r"mismatched collective #(\d+): (.*?); ranks? \d+ \(pid")
# The launcher's form, when Gloo aborted a rank inside the collective (no number for that rank): the others' "its #N"
MISMATCH_FAILED = re.compile(r"mismatched collective(?: #(\d+))?: (.*?); rank \d+ failed")
ENTRY = re.compile(r"rank (\d+) (\w+) (\[.*?\]\])")


def judge(r: Run, lines: list[tuple[float, str]], onset: float | None, summary: dict[str, Any] | None) -> None:
    """What was said, against the truth."""
    said_lines = {}
    for t, ln in lines:
        if (m := STRAGGLER.search(ln)) is not None:
            said_lines.setdefault((int(m.group(1)), int(m.group(2))), t)
            r.reports.append(ln)
        elif "stopped making progress" in ln or FAILED.search(ln) or "mismatched collective" in ln:
            r.reports.append(ln)
    r.episodes = list(summary.get("stragglers") or []) if summary else []
    hang = next(((t, ln) for t, ln in lines if "stopped making progress" in ln), None)
    failed = next(((t, ln) for t, ln in lines if FAILED.search(ln) and "stopped making progress" not in ln), None)
    if r.kind in ("", *SLOW):
        eps = r.episodes or [{"rank": k[0], "since_step": k[1], "detected_at_step": None, "cause": "?"}
                             for k in said_lines]  # a run that did not finish: the lines only
        if (e := judge_episodes(r, eps)) is not None:
            t = said_lines.get((e["rank"], e["since_step"]))
            r.detection_s = round(t - onset, 3) if t is not None and onset is not None else None
    if hang is not None and r.kind not in SLOW:
        t, ln = hang
        m = MISMATCH.search(ln)
        head = ln.split("stopped making progress")[0]
        culprits = [int(x) for x in re.findall(r"(\d+) \(pid \d+", head)]
        coll = re.search(r"last collective (#\d+ \w+ \[.*?\]\])", ln)
        r.collective = coll.group(1) if coll else ""
        if m is not None:
            r.said, r.collective = "mismatch", f"#{m.group(1)}"
            r.said_rank = odd_ranks(entries(m.group(2)))
        else:
            r.said, r.said_rank = "hang", culprits
        r.detection_s = round(t - onset, 3) if onset is not None else None
    elif failed is not None and r.kind not in SLOW:
        t, ln = failed
        m = FAILED.search(ln)
        assert m is not None
        r.said, r.said_rank = "failed", [int(m.group(1))]
        if (mm := MISMATCH_FAILED.search(ln)) is not None:
            seq = mm.group(1) or (re.findall(r"its #(\d+)", mm.group(2)) or [""])[0]
            r.said, r.collective = "mismatch", f"#{seq}"
            r.said_rank = odd_ranks(entries(mm.group(2)))
        r.detection_s = round(t - onset, 3) if onset is not None else None
    r.verdict = verdict(r)


def judge_episodes(r: Run, eps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the monitor said about a slow or clean run, from its episodes (the summary's ``stragglers``): the first
    episode of the faulty rank detected at or after the onset, else another rank's (wrong). Returns that episode."""
    after = [e for e in eps if r.kind and (e["detected_at_step"] or 0) >= r.step]
    r.early = len(eps) - len(after)
    mine = [e for e in after if e["rank"] == r.rank]
    r.other = len(after) - len(mine)
    if after:
        e = (mine or after)[0]
        r.said, r.said_rank, r.detected_at_step = e["cause"], [e["rank"]], e["detected_at_step"]
        r.detection_steps = e["detected_at_step"] - r.step if e["detected_at_step"] else None
        return e
    if eps and not r.kind:
        r.said, r.said_rank = eps[0]["cause"], [eps[0]["rank"]]
    return None


def entries(parts: str) -> list[tuple[int, str]]:
    """A mismatch line's ``rank R op [[sizes]]`` parts (a rank without sizes, ended by a signal, is left out)."""
    return [(int(rank), f"{op} {sizes}") for rank, op, sizes in ENTRY.findall(parts)]


def odd_ranks(entries: list[tuple[int, str]]) -> list[int]:
    """The ranks of a mismatch whose collective differs from the others': the minority, or (no majority) the ranks
    not in the metric all-reduce the job's code makes at that place."""
    groups: dict[str, list[int]] = {}
    for rank, what in entries:
        groups.setdefault(what, []).append(rank)
    sizes = sorted(len(v) for v in groups.values())
    if len(groups) > 1 and sizes[-1] > sizes[-2]:
        big = max(groups.values(), key=len)
        return sorted(rank for rank, _ in entries if rank not in big)
    return sorted(rank for rank, what in entries if what != "all_reduce [[3]]")


def verdict(r: Run) -> str:
    if not r.kind:
        return "false_alarm" if (r.said or r.reports or r.rc != 0) else "clean"
    if not r.said:
        return "missed"
    if r.said_rank != [r.rank]:
        return "wrong"
    if r.said == "unknown":
        return "unknown"
    if r.said != r.truth:
        return "wrong"
    if r.truth == "hang" and not r.collective:
        return "wrong"  # a hang must be named with its collective
    return "right"


# ---- the whole benchmark
def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


def quota_allowed() -> bool:
    base = Path(CGROUP).parent
    return (base / "cpu.cfs_quota_us").exists() and os.access(base, os.W_OK)


def plan(runs: int, seed: int, max_nproc: int, kinds: list[str]) -> list[Run]:
    """``runs`` injected runs (the kinds in a shuffled round-robin) with a clean run after every third."""
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < runs:
        cycle = list(kinds)
        rng.shuffle(cycle)
        order += cycle
    out: list[Run] = []
    for kind in order[:runs]:
        n = rng.randint(2, max_nproc)
        out.append(Run(len(out), kind, n, rng.randrange(n), rng.randint(20, 50), round(amount(kind, rng), 4),
                       TRUTH[kind]))
        if sum(1 for x in out if x.kind) % 3 == 0:
            out.append(Run(len(out), "", rng.randint(2, max_nproc)))
    if not any(not x.kind for x in out):
        out.append(Run(len(out), "", 2))
    return out


def overhead(chunks: int) -> dict[str, Any]:
    """``straggler_monitor.py``'s same-run on/off measurement of the monitor (its toggled run only)."""
    if chunks <= 0:
        return {"overhead_ratio": None}
    sys.path.insert(0, str(HERE.parent))  # the benchmarks' shared helpers
    from _common import launch_self
    from doctor_accounting import summary

    r = launch_self(str(HERE.parent / "straggler_monitor.py"), ["--chunks", str(chunks)])
    s = summary(r["inside"], "chunk")
    return {"overhead_ratio": s["ratio"], "overhead_ci90": [s["lo"], s["hi"]], "overhead_pairs": s["pairs"],
            "overhead_step_off_s": s["step_off_s"]}


def leftovers() -> list[str]:
    import psutil

    out = []
    for q in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(q.info["cmdline"] or [])
        if "_fault_job.py" in cmd or "sched_setaffinity(0,{int(sys.argv[1])})" in cmd:
            out.append(f"{q.info['pid']} {cmd[:100]}")
    return out


def median(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=12, help="injected runs (clean runs come in proportion)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="JSONL file: one line per run (truth, what was said, detection)")
    ap.add_argument("--max-nproc", type=int, default=2, choices=[2, 3, 4], help="processes per run: 2..this")
    ap.add_argument("--kinds", default=",".join(TRUTH), help="fault kinds to draw from (comma-separated)")
    ap.add_argument("--overhead-chunks", type=int, default=40,
                    help="chunks of 24 steps in the monitor's on/off run (0: not measured)")
    ap.add_argument("--skip-first", type=int, default=None, help="log.skip_first of every run (default: trainscale's)")
    ap.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds before a run is killed")
    ap.add_argument("--windows", action="store_true", help="keep every window the monitor scored in --out's lines "
                                                           "(straggler_replay.py replays them with other settings)")
    a = ap.parse_args()
    stop: list[int] = []  # SIGTERM or Ctrl-C: the run under way ends (it has its own timeout), then the summary
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: stop.append(signum))
    kinds = [k for k in a.kinds.split(",") if k]
    if "quota" in kinds and not quota_allowed():
        print("fault_localisation: no writable cgroup v1 cpu controller: no quota faults", file=sys.stderr)
        kinds.remove("quota")
    runs = plan(a.runs, a.seed, a.max_nproc, kinds)
    out = open(a.out, "w") if a.out else None
    t_start = time.monotonic()
    done = 0
    try:
        for r in runs:
            if stop:
                print(f"fault_localisation: stopped by signal {stop[0]} after {done} of {len(runs)} runs",
                      file=sys.stderr, flush=True)
                break
            run_job(r, a.timeout, [] if a.skip_first is None else ["--log.skip_first", str(a.skip_first)], a.windows)
            done += 1
            print(f"run {r.i}: {r.kind or 'clean'} rank {r.rank} step {r.step} x{r.amount} on {r.nproc}: "
                  f"said {r.said or '-'} {r.said_rank} at {r.detected_at_step} ({r.detection_s} s) -> {r.verdict}"
                  f"{f' (effect {r.effect}x)' if r.effect is not None else ''}"
                  f"  [{r.wall_s} s]", file=sys.stderr, flush=True)
            if out:
                out.write(json.dumps(asdict(r)) + "\n")
                out.flush()
    finally:
        if out:
            out.close()
        if os.path.isdir(CGROUP):
            try:
                os.rmdir(CGROUP)
            except OSError as e:
                print(f"fault_localisation: {CGROUP} not removed: {e}", file=sys.stderr)
    faults_s = time.monotonic() - t_start
    runs = runs[:done]  # the runs completed, all of them unless stopped
    cost = overhead(0 if stop else a.overhead_chunks)
    injected = [r for r in runs if r.kind]
    clean = [r for r in runs if not r.kind]
    right = sum(r.verdict == "right" for r in injected)
    unknown = sum(r.verdict == "unknown" for r in injected)
    judged = len(injected) - unknown
    lo, hi = wilson(right, judged)
    slow = [r for r in injected if r.kind in SLOW and r.verdict == "right"]
    hangs = [r for r in injected if r.truth in ("hang", "mismatch", "failed") and r.verdict == "right"]
    per_kind: dict[str, str] = {}
    for k in kinds:
        ks = [r for r in injected if r.kind == k]
        if ks:
            per_kind[k] = f"{sum(r.verdict == 'right' for r in ks)}/{len(ks)}"
    left = leftovers()
    result = {
        "runs": len(injected), "clean_runs": len(clean), "accuracy": right / judged if judged else None,
        "wilson_low": lo, "wilson_high": hi, "right": right, "judged": judged, "unknown": unknown,
        "missed": sum(r.verdict == "missed" for r in injected), "early_episodes": sum(r.early for r in injected),
        "other_rank_episodes": sum(r.other for r in injected), "wrong": sum(r.verdict == "wrong" for r in injected),
        "false_alarm_rate": sum(r.verdict == "false_alarm" for r in clean) / len(clean) if clean else None,
        "false_alarms": [f"{r.said or 'report'} rank {r.said_rank} from step {r.episodes[0]['since_step'] if r.episodes else '?'}"
                         f" (outside load {r.outside_cores} cores)" for r in clean if r.verdict == "false_alarm"],
        "median_detection_steps": median([r.detection_steps for r in slow]),
        "median_detection_s": median([r.detection_s for r in slow]),
        "median_hang_report_s": median([r.detection_s for r in hangs]),
        "max_hang_report_s": max((r.detection_s for r in hangs if r.detection_s is not None), default=None),
        "hang_bound_s": TIMEOUT_S + 10, "per_kind": per_kind,
        "median_effect": {k: median([r.effect for r in injected if r.kind == k]) for k in kinds if k in SLOW},
        **cost, "overhead_source":
        "straggler_monitor.py toggled run (same-run on/off chunks)", "timeouts": sum(r.timed_out for r in runs),
        "processes_left": sum(r.left for r in runs) + len(left), "seed": a.seed, "max_nproc": a.max_nproc,
        "stopped_early": bool(stop),
        "wall_s": round(faults_s, 1)}
    for line in left:
        print(f"fault_localisation: left behind: {line}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
