"""Soak: N consecutive fault-injection runs (kill -9 with a restart, SIGSTOP, SIGTERM to the launcher), mixed.

Not a test (minutes of CPU): ``PYTHONPATH=src:tests python tests/survive/soak.py [N]``. Each run has a hard
timeout and its whole session is killed after it; prints one JSON line per run and a total as the last line.
A hang is a run that reached its timeout; a lost step is a checkpoint older than the last one due before the fault.
"""

import json
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from survive_jobs import JOB, finish, run, start, wait_for  # noqa: E402


def one(kind: str, rng: random.Random, folder: Path) -> dict:
    base = ["train", "--nproc", "2", *JOB, "--checkpoint.dir", str(folder), "--job.timeout_s", "10"]
    step = rng.randint(11, 38)
    t0 = time.monotonic()
    if kind == "kill":
        r = run([*base, "--max-restarts", "1", "--json", str(folder / "s.json")], 300, fault=f"kill@{step}:1")
        s = json.loads((folder / "s.json").read_text()) if r.rc == 0 else {}
        ok = r.rc == 0 and s.get("restarts") == 1 and s.get("resumed_from_step") == step // 10 * 10
        lost = 0 if ok else None
    elif kind == "stop":
        r = run(base, 300, fault=f"stop@{step}:{rng.randint(0, 1)}")
        latest = (folder / "latest").read_text().strip()
        ok = r.rc == 3 and "stopped making progress" in r.text
        lost = max(0, step // 10 * 10 - int(latest.split("_")[1].split(".")[0]))
    else:
        p = start(base)
        wait_for(folder / "latest", p, 200)
        time.sleep(rng.random() * 0.3)
        p.send_signal(signal.SIGTERM)
        r = finish(p, 200)
        latest = (folder / "latest").read_text().strip()
        ok = r.rc in (75, 0)
        lost = 0  # the preemption checkpoint is of the step where the ranks stopped
        step = latest
    return {"kind": kind, "fault_step": step, "rc": r.rc, "ok": ok, "hang": "[test] killed" in r.text,
            "left": len(r.left), "lost_steps": lost, "wall_s": round(time.monotonic() - t0, 1)}


def main(n: int = 20) -> None:
    rng = random.Random(12)
    kinds = (["kill", "stop", "term"] * n)[:n]
    rng.shuffle(kinds)
    rows = []
    for i, kind in enumerate(kinds):
        with tempfile.TemporaryDirectory() as d:
            row = one(kind, rng, Path(d))
        rows.append(row)
        print(json.dumps({"run": i + 1, **row}), flush=True)
    print(json.dumps({"runs": n, "hangs": sum(r["hang"] for r in rows), "ok": sum(r["ok"] for r in rows),
                      "left_processes": sum(r["left"] for r in rows),
                      "lost_steps": sum(r["lost_steps"] or 0 for r in rows),
                      "wall_s": round(sum(r["wall_s"] for r in rows), 1)}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
