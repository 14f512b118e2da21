"""The data-parallel reducer's own time per step, measured on the user's job: ``reducer_s`` of a calibration.

At world size 1 ``trainscale train`` runs the bare module, so the calibration's 1-process step has none of what
DDP adds at P > 1 beyond the wire: the gradients copied into its buckets as backward readies them and back out
after the exchange, the bucket's division by the world, its autograd hooks. The all-reduce itself is the probe's.
Here the job's own model steps alternately bare and inside DDP on a process group of one (Gloo, in this process:
no port, no peers), in blocks, at the calibration's thread count; the reducer's time is the difference of the two
medians (wall seconds and CPU seconds per step). The no-exchange run of the doctor (``ablate.comm``) cannot give
it: without a gradient sync DDP's reducer prepares nothing and its hooks return at once.

Run by :func:`measure` in a child process (a process group of its own); by hand::

    python -m trainscale.sim.reducer --threads 1 --out reducer.json -- --model mlp --data digits
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["measure", "command", "SOURCE"]

SOURCE = ("measured by trainscale plan calibrate: this job's step inside DDP on a process group of one minus "
          "the bare step, same process, same threads (sim/reducer.py)")


def _batch(train_args: list[str]) -> tuple[Any, Any, Any, Any]:
    """The job's model, one batch of its shape and its strategy options."""
    import torch

    from ..data import build_datasets
    from ..jobs import check_train_args
    from ..models import build_model

    cfg = check_train_args(train_args)
    _, _, info = build_datasets(cfg.data)
    assert info is not None  # model_layout refused such a data set before this runs
    model = build_model(cfg.model.name, info.in_shape, info.num_classes, cfg.model.width, cfg.model.depth)
    x = torch.randn(cfg.data.batch_size, *info.in_shape)
    y = torch.randint(0, info.num_classes, (cfg.data.batch_size,))
    return model, x, y, cfg.strategy


def _wrapped(model: Any, strategy: Any) -> Any:
    """``model`` in DDP as the job wraps it (``strategies.ddp.apply_ddp``) on the process group of one this
    process holds; ``auto`` buckets take DDP's default, as the skeleton does."""
    import torch

    from ..distributed.env import DistEnv
    from ..strategies.ddp import apply_ddp

    env = DistEnv(0, 1, 0, 1, 0, 1, torch.device("cpu"), "gloo", "", torch.get_num_threads())
    return apply_ddp(model, env, strategy, 25.0 if strategy.bucket_mb == "auto" else None)


def _block(step: Any, steps: int) -> tuple[list[float], list[float]]:
    """``steps`` steps of ``step``: wall and CPU seconds of each."""
    walls, cpus = [], []
    for _ in range(steps):
        w0, c0 = time.perf_counter(), time.process_time()
        step()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return walls, cpus


def _run(train_args: list[str], threads: int, blocks: int, steps: int) -> dict[str, Any]:
    """Bare and DDP blocks alternated on one model; the medians' differences (clamped at 0: copies are not free)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    model, x, y, strategy = _batch(train_args)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = _wrapped(model, strategy)
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)

        def stepper(m: Any) -> Any:
            def step() -> None:
                opt.zero_grad(set_to_none=True)  # as the train loop does
                F.cross_entropy(m(x), y).backward()
                opt.step()
            return step

        times: dict[str, tuple[list[float], list[float]]] = {"bare": ([], []), "ddp": ([], [])}
        for b in range(blocks + 1):
            for name, m in (("bare", model), ("ddp", ddp)) if b % 2 == 0 else (("ddp", ddp), ("bare", model)):
                w, c = _block(stepper(m), steps)
                if b:  # the first round warms both up (allocator, the reducer's first-iteration rebuild)
                    times[name][0].extend(w)
                    times[name][1].extend(c)
    finally:
        dist.destroy_process_group()
    med = {k: (statistics.median(w), statistics.median(c)) for k, (w, c) in times.items()}
    return {"s": max(0.0, med["ddp"][0] - med["bare"][0]), "cpu_s": max(0.0, med["ddp"][1] - med["bare"][1]),
            "bare_step_s": med["bare"][0], "ddp_step_s": med["ddp"][0], "threads": threads,
            "bucket_mb": float(ddp.bucket_bytes_cap) / 2 ** 20, "steps": blocks * steps, "unit": "s per step", "source": SOURCE}


def _argv(train_args: list[str], threads: int, blocks: int, steps: int) -> list[str]:
    return ["--threads", str(threads), "--blocks", str(blocks), "--steps", str(steps), "--", *train_args]


def command(train_args: list[str], threads: int, blocks: int = 4, steps: int = 10) -> str:
    """The measurement as a user would type it."""
    import shlex

    return "python -m trainscale.sim.reducer " + " ".join(shlex.quote(c) for c in _argv(train_args, threads, blocks,
                                                                                          steps))


def measure(train_args: list[str], threads: int, timeout: float, blocks: int = 4, steps: int = 10) -> dict[str, Any]:
    """The reducer's wall and CPU seconds per step of the job at ``threads`` threads (a child process)."""
    cmd = [sys.executable, "-m", "trainscale.sim.reducer", *_argv(train_args, threads, blocks, steps)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"reducer measurement gave no result within {timeout:g}s") from None
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"reducer measurement failed: {tail}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    """Entry of ``python -m trainscale.sim.reducer``: print (or write) the measurement as one JSON line."""
    p = argparse.ArgumentParser(prog="python -m trainscale.sim.reducer", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="intra-op threads, as a rank of the job gets")
    p.add_argument("--blocks", type=int, default=4, help="timed blocks of each (bare, DDP), alternated")
    p.add_argument("--steps", type=int, default=10, help="steps per block")
    p.add_argument("--out", default="", help="also write the JSON here")
    a, rest = p.parse_known_args(argv)
    got = _run([r for r in rest if r != "--"], max(1, a.threads), max(1, a.blocks), max(1, a.steps))
    line = json.dumps(got)
    if a.out:
        Path(a.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
