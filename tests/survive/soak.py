"""Soak: N consecutive fault-injection runs (kill -9 with a restart, SIGSTOP, SIGTERM to the launcher), mixed.

Not a test (minutes of CPU): ``PYTHONPATH=src:tests python tests/survive/soak.py [N]``. Each run has a hard
timeout and its whole session is killed after it; a run that ended early (stopped rank, preemption) is then
resumed with ``--resume auto``, and every run must end with the weights of one uninterrupted run, bit for bit.
Prints one JSON line per run and a total as the last line. A hang is a run that reached its timeout; lost steps
are steps done before the fault that the newest checkpoint does not hold.
"""

import json
import random
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from survive_jobs import JOB, finish, run, same_weights, start, wait_for  # noqa: E402

STEPS = int(JOB[JOB.index("--steps") + 1])


def _ckpt_step(folder: Path) -> int:
    name = (folder / "latest").read_text().strip()  # step_20.pt, or last.pt when the run had finished
    return STEPS if name == "last.pt" else int(name.split("_")[1].split(".")[0])


def one(kind: str, rng: random.Random, folder: Path, reference: Path) -> dict:
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
        ok = r.rc == 3 and "stopped making progress" in r.text
        lost = max(0, step // 10 * 10 - _ckpt_step(folder))  # the checkpoints due before the stop were all written
    else:
        p = start(base)
        wait_for(folder / "latest", p, 200)
        time.sleep(rng.random() * 0.3)
        p.send_signal(signal.SIGTERM)
        r = finish(p, 200)
        ok = r.rc in (75, 0)
        logged = [int(m) for m in re.findall(rf"step (\d+)/{STEPS}", r.text)]
        step = _ckpt_step(folder)
        lost = max(0, max(logged, default=0) - step)  # the preemption checkpoint holds the step the ranks stopped at
    resumed = None
    if r.rc != 0 and ok:  # ended early: the newest checkpoint must carry the job to the same end
        resumed = run([*base, "--resume", "auto"], 300)
        ok = resumed.rc == 0
    same = ok and same_weights(reference, folder / "last.pt")
    done = [r, *([resumed] if resumed else [])]
    return {"kind": kind, "fault_step": step, "rc": r.rc, "resume_rc": resumed.rc if resumed else None,
            "ok": bool(ok and same), "same_weights": same, "hang": any("[test] killed" in x.text for x in done),
            "left": sum(len(x.left) for x in done), "lost_steps": lost, "wall_s": round(time.monotonic() - t0, 1)}


def main(n: int = 20) -> None:
    rng = random.Random(12)
    kinds = (["kill", "stop", "term"] * n)[:n]
    rng.shuffle(kinds)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        ref = Path(d) / "reference"
        r = run(["train", "--nproc", "2", *JOB, "--checkpoint.dir", str(ref)], 300)
        assert r.rc == 0, r.text
        for i, kind in enumerate(kinds):
            with tempfile.TemporaryDirectory() as run_dir:
                row = one(kind, rng, Path(run_dir), ref / "last.pt")
            rows.append(row)
            print(json.dumps({"run": i + 1, **row}), flush=True)
    print(json.dumps({"runs": n, "hangs": sum(r["hang"] for r in rows), "ok": sum(r["ok"] for r in rows),
                      "same_weights": sum(r["same_weights"] for r in rows),
                      "left_processes": sum(r["left"] for r in rows),
                      "lost_steps": sum(r["lost_steps"] or 0 for r in rows),
                      "wall_s": round(sum(r["wall_s"] for r in rows), 1)}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
