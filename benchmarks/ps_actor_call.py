"""CPU per call of a Ray actor method by actor kind: plain, threaded, asyncio (why the learner is threaded).

Each kind receives one 40 KB float32 array (an object-store reference) and returns (meta, array) as two
objects, as a learner's mini-batch does, 2000 calls in a row; the kinds alternate over two rounds in one
Ray instance. Reported: the actor process's CPU milliseconds per call (from /proc), the driver's, and the
wall time per call. The last line of stdout is one JSON object.

    python benchmarks/ps_actor_call.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import ray
from _ps_cpu import cpu_s


class Plain:
    def pid(self) -> int:
        return os.getpid()

    def step(self, w: np.ndarray) -> tuple:
        return {"t": time.perf_counter()}, w


class Async:
    async def pid(self) -> int:
        return os.getpid()

    async def step(self, w: np.ndarray) -> tuple:
        return {"t": time.perf_counter()}, w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    kinds = {"plain": ray.remote(num_cpus=0)(Plain).remote(),
             "threaded (max_concurrency=4)": ray.remote(num_cpus=0, max_concurrency=4)(Plain).remote(),
             "asyncio": ray.remote(num_cpus=0, max_concurrency=16)(Async).remote()}
    pids = {k: ray.get(a.pid.remote(), timeout=60) for k, a in kinds.items()}
    w = ray.put(np.ones(10_000, np.float32))
    rows: dict = {}
    try:
        for r in range(2):
            for name, actor in (kinds.items() if r % 2 == 0 else list(kinds.items())[::-1]):
                step = actor.step.options(num_returns=2)
                a0, d0, t0 = cpu_s(pids[name]), cpu_s(os.getpid()), time.perf_counter()
                for _ in range(args.calls):
                    ray.get(step.remote(w)[0], timeout=60)
                wall = time.perf_counter() - t0
                row = {"actor_cpu_ms": 1e3 * (cpu_s(pids[name]) - a0) / args.calls,
                       "driver_cpu_ms": 1e3 * (cpu_s(os.getpid()) - d0) / args.calls, "wall_ms": 1e3 * wall / args.calls}
                rows.setdefault(name, []).append(row)
                print(f"round {r} {name}: actor {row['actor_cpu_ms']:.3f} ms CPU/call, driver "
                      f"{row['driver_cpu_ms']:.3f}, wall {row['wall_ms']:.3f} ms", flush=True)
    finally:
        ray.shutdown()
    print(json.dumps({name: {k: round(statistics.median(x[k] for x in rs), 3) for k in rs[0]}
                      for name, rs in rows.items()}))


if __name__ == "__main__":
    main()
