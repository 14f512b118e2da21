"""Where an update's time goes: trainscale's ``async`` parameter server against Ray's example pattern.

For each model (the small MLP of ``ps_throughput.py`` and the 4.35 MB one of ``ps_scaling.py``) and each
pattern, in one Ray instance, alternating: updates/s, and the CPU milliseconds per update of each role
(learners, server/shards, driver, Ray's raylet and GCS) read from /proc. For trainscale also the mean
wall time of each phase of a mini-batch and an update, from the run summary's ``phases_ms`` (timestamps
taken in the learner, the shards and the coordinator: one monotonic clock per machine). And the object
store's own cost for one update's payload: ``ray.put`` then ``ray.get`` of the gradient arrays, timed in
the driver (serialisation included). The last line of stdout is one JSON object.

    python benchmarks/ps_breakdown.py [--learners 4] [--updates 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import ps_throughput as tp
import ray
from _ps_cpu import CpuMeter, ray_daemons

from trainscale.config import DataConfig, load_config
from trainscale.data import build_datasets
from trainscale.ps.actors import PsActors
from trainscale.ps.job import run_ps

MODELS = {"small": (64, 2), "4MB": (512, 5)}  # (width, depth) of the MLP on digits


def example_actors(info, images, labels, learners: int, width: int, depth: int):
    """Ray's example pattern (ps_throughput's actors) on an MLP of this width and depth."""
    server = tp.ExampleServer.remote(info, width, depth)
    workers = [tp.ExampleWorker.remote(r, learners, images, labels, info, width, depth) for r in range(learners)]
    return server, workers


def trainscale_run(actors, learners: int, updates: int, width: int, depth: int) -> dict:
    cfg = load_config(["--ps.mode", "async", "--ps.learners", str(learners), "--ps.steps", str(updates),
                       "--model.width", str(width), "--model.depth", str(depth), "--data.batch_size", "32",
                       "--ps.lr", "0.01", "--ps.snapshot_every", "1000", "--log.progress", "none"])
    return run_ps(cfg, actors=actors)


def put_get_ms(numel: int, repeats: int = 30) -> float:
    """Milliseconds to ray.put one update's gradient (float32 arrays) and ray.get it back, in the driver."""
    grads = [np.ones(numel, np.float32)]
    t0 = time.perf_counter()
    for _ in range(repeats):
        ray.get(ray.put(grads))
    return 1e3 * (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--learners", type=int, default=4)
    ap.add_argument("--updates", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    train, _, info = build_datasets(DataConfig(name="digits"))
    images, labels = train.images.numpy(), train.labels.numpy()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    results: dict = {}
    try:
        daemons = ray_daemons()
        actors = PsActors(args.learners, 1)
        ours = {"learners": ray.get([a.pid.remote() for a in actors.learners], timeout=120),
                "server": ray.get([a.pid.remote() for a in actors.shards], timeout=120),
                "driver": [os.getpid()], "raylet+GCS": daemons}
        for name, (width, depth) in MODELS.items():
            server, workers = example_actors(info, images, labels, args.learners, width, depth)
            theirs = {"learners": ray.get([w.__ray_call__.remote(lambda self: os.getpid()) for w in workers]),
                      "server": [ray.get(server.__ray_call__.remote(lambda self: os.getpid()))],
                      "driver": [os.getpid()], "raylet+GCS": daemons}
            updates = args.updates if name == "small" else max(60, args.updates // 3)
            tp.ray_example_async(server, workers, 20)
            trainscale_run(actors, args.learners, 20, width, depth)
            for r in range(args.repeats):
                for who in (("trainscale", "example") if r % 2 == 0 else ("example", "trainscale")):
                    meter = CpuMeter(ours if who == "trainscale" else theirs)
                    meter.start()
                    if who == "trainscale":
                        s = trainscale_run(actors, args.learners, updates, width, depth)
                        rate, phases, numel = s["updates"] / s["timeline"][-1]["t"], s.get("phases_ms", {}), \
                            s.get("parameters", 0)
                    else:
                        rate, phases = tp.ray_example_async(server, workers, updates), {}
                    cpu = {k: round(1e3 * v / updates, 3) for k, v in meter.stop().items()}
                    results.setdefault((name, who), []).append({"updates_per_s": rate, "cpu_ms": cpu,
                                                                 "phases_ms": phases})
                    print(f"{name} {who}: {rate:.1f} updates/s, CPU ms/update {cpu}", flush=True)
            results[(name, "put_get_ms")] = put_get_ms(numel)
            for a in [server, *workers]:
                ray.kill(a)
        actors.close()
    finally:
        ray.shutdown()
    out = {}
    for name in MODELS:
        row = {"put_get_ms": round(results[(name, "put_get_ms")], 3)}
        for who in ("trainscale", "example"):
            rs = results[(name, who)]
            row[who] = {"updates_per_s": round(statistics.median(r["updates_per_s"] for r in rs), 1),
                        "rounds": [round(r["updates_per_s"], 1) for r in rs],
                        "cpu_ms": {k: round(statistics.median(r["cpu_ms"][k] for r in rs), 3) for k in rs[0]["cpu_ms"]},
                        "phases_ms": {k: round(statistics.median(r["phases_ms"][k] for r in rs), 3)
                                      for k in rs[0]["phases_ms"]}}
        out[name] = row
        print(f"\n{name}: put+get of one update's gradient {row['put_get_ms']:.3f} ms")
        for who in ("trainscale", "example"):
            print(f"  {who}: {row[who]['updates_per_s']} updates/s {row[who]['rounds']}  CPU ms/update "
                  f"{row[who]['cpu_ms']}  phases {row[who]['phases_ms']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
