"""CPU per thread of a running job's processes, from /proc: which thread a rank's CPU per step goes to.

Runs the command, samples every descendant process's threads at two instants, prints each thread's share of a
core between them and its context switches per second (voluntary: it slept; non-voluntary: it was preempted);
the last line is the same as one JSON object. The exit status is the command's.
benchmarks/results/2026-11-24-plan-accuracy.md uses it to split mlp's CPU per step at P ranks into the main thread and Gloo's threads::

    python benchmarks/campaigns/thread_cpu.py 6 14 -- trainscale train --nproc 4 --model mlp --data digits --steps 2000

Linux only (/proc). Python threads are all named like the process ("python"); the thread id tells them apart.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import psutil

TICK = os.sysconf("SC_CLK_TCK")


def _threads(root: int) -> dict[tuple[int, int], tuple[str, float, int, int]]:
    """(pid, tid) -> (thread name, CPU seconds, voluntary, non-voluntary switches) of ``root``'s descendants."""
    out = {}
    for proc in psutil.Process(root).children(recursive=True):
        for task in Path(f"/proc/{proc.pid}/task").glob("*"):
            try:
                stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
                status = dict(ln.split(":", 1) for ln in (task / "status").read_text().splitlines() if ":" in ln)
                out[(proc.pid, int(task.name))] = ((task / "comm").read_text().strip(),
                                                   (int(stat[11]) + int(stat[12])) / TICK,
                                                   int(status["voluntary_ctxt_switches"]),
                                                   int(status["nonvoluntary_ctxt_switches"]))
            except (OSError, KeyError, IndexError):
                continue  # a thread that ended between listing and reading
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("start", type=float, help="seconds after launch of the first sample (past start-up)")
    ap.add_argument("end", type=float, help="seconds after launch of the second sample (before the job ends)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd or a.end <= a.start:
        ap.error("give START < END and a command after --")
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(a.start)
        first, t0 = _threads(job.pid), time.perf_counter()
        time.sleep(a.end - a.start)
        second, dt = _threads(job.pid), time.perf_counter() - t0
    finally:
        rc = job.wait()
    by_pid: dict[int, list[dict]] = {}
    for (pid, tid), (name, cpu, vol, nvol) in second.items():
        if (pid, tid) in first:
            _, cpu0, vol0, nvol0 = first[(pid, tid)]
            by_pid.setdefault(pid, []).append({"thread": f"{name}:{tid}", "cores": round((cpu - cpu0) / dt, 4),
                                               "voluntary_per_s": round((vol - vol0) / dt, 1),
                                               "preempted_per_s": round((nvol - nvol0) / dt, 1)})
    processes = []
    for pid, rows in sorted(by_pid.items()):
        total = sum(r["cores"] for r in rows)
        if total < 0.01:
            continue  # the launcher and other idle processes
        rows.sort(key=lambda r: -r["cores"])
        processes.append({"pid": pid, "cores": round(total, 4), "threads": rows})
        print(f"process {pid}: {total:.3f} cores")
        for r in rows:
            print(f"  {r['thread']:24s} {r['cores']:.3f} cores  switches/s: {r['voluntary_per_s']:5.0f} voluntary "
                  f"{r['preempted_per_s']:5.0f} preempted")
    # Output contract of the benchmarks: the last line is one JSON object.
    print(json.dumps({"window_s": round(dt, 3), "processes": processes, "exit_status": rc}))
    raise SystemExit(rc)

if __name__ == "__main__":
    main()
