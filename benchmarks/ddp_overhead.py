"""trainscale's ddp step against a hand-written plain DDP loop: same model, batch and data, 2 processes.

Three loops run in the same two processes, each timed per step with the same clock: a hand-written DDP
loop, ``trainscale train``'s Trainer, and a user's loop on the run API (``trainscale.init``). Each round runs
the three in one of their six orders (every order once in six rounds), so no loop always follows the same
one; a round's ratios (its loop's median step over the plain loop's in that round) are paired, so the host's
drift between rounds cancels. Result: the median of the per-round ratios, and their spread (max - min) /
median. Last line: one JSON object.
Run: python benchmarks/ddp_overhead.py [--rounds 6 --steps 40]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

MODEL = ["--model", "resnet18", "--model.width", "8", "--data", "synthetic", "--data.image_size", "16",
         "--batch-size", "16", "--data.eval_size", "0", "--log.progress", "none", "--log.skip_first", "5"]


def plain_ddp_steps(steps: int, skip: int) -> list[float]:
    """What a user writes by hand: DistributedSampler, DataLoader, DDP, SGD (float data prepared up front)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from trainscale.config import DataConfig
    from trainscale.data import build_datasets
    from trainscale.models import build_model

    train, _, info = build_datasets(DataConfig(name="synthetic", image_size=16))
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    ds = TensorDataset((train.images.float() - mean) / std, train.labels)
    sampler = DistributedSampler(ds, seed=0)
    loader = DataLoader(ds, batch_size=16, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = DDP(build_model("resnet18", info.in_shape, info.num_classes, width=8))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    times, epoch, it = [], 0, iter(loader)
    t_prev = time.perf_counter()
    for step in range(steps):
        try:
            x, y = next(it)
        except StopIteration:
            epoch += 1
            sampler.set_epoch(epoch)
            it = iter(loader)
            x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        now = time.perf_counter()
        if step >= skip:
            times.append(now - t_prev)
        t_prev = now
    loss.item()
    dist.barrier()
    return times


def run_api_steps(cfg: object, steps: int) -> float:
    """A user's loop on the run API over the same job; its median step time."""
    import trainscale
    from trainscale.data import build_datasets
    from trainscale.models import build_model

    run = trainscale.init(cfg)
    train, _, info = build_datasets(run.cfg.data)
    model = build_model("resnet18", info.in_shape, info.num_classes, width=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt, loader = run.prepare(model, opt, train, data_info=info)
    for x, y in run.batches(loader, steps=steps):
        run.backward(torch.nn.functional.cross_entropy(model(x), y))
        run.step()
    return run.finish()["step_time_s"]


def worker(rounds: int, steps: int, out: str) -> None:
    from trainscale import Trainer
    from trainscale.config import load_config
    from trainscale.distributed import init_distributed

    cfg = load_config(_pairs(MODEL) + ["--job.steps", str(steps)])
    init_distributed(cfg.job)  # one process group and thread setting for all loops
    ts, api, plain = [], [], []
    loops = {"plain": lambda: statistics.median(plain_ddp_steps(steps, 5)),
             "ts": lambda: Trainer(cfg).fit()["step_time_s"], "api": lambda: run_api_steps(cfg, steps)}
    orders = list(itertools.permutations(loops))
    for r in range(rounds):
        for name in orders[r % len(orders)]:
            {"plain": plain, "ts": ts, "api": api}[name].append(loops[name]())
    if int(os.environ["RANK"]) == 0:
        Path(out).write_text(json.dumps({"ts": ts, "api": api, "plain": plain}))


def _pairs(argv: list[str]) -> list[str]:
    short = {"--model": "--model.name", "--data": "--data.name", "--batch-size": "--data.batch_size"}
    return [short.get(a, a) for a in argv]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--worker-out")
    a = ap.parse_args()
    if a.worker_out:
        worker(a.rounds, a.steps, a.worker_out)
        return
    from _common import emit, launch_self, spread

    r = launch_self(__file__, ["--rounds", str(a.rounds), "--steps", str(a.steps)])

    ts, api, plain = (statistics.median(r[k]) for k in ("ts", "api", "plain"))
    ts_ratios = [t / p for t, p in zip(r["ts"], r["plain"])]
    api_ratios = [u / p for u, p in zip(r["api"], r["plain"])]
    for i, (t, u, p) in enumerate(zip(r["ts"], r["api"], r["plain"])):
        print(f"round {i + 1}: trainscale train {t * 1e3:.2f} ms/step ({t / p:.3f}), run API {u * 1e3:.2f} "
              f"ms/step ({u / p:.3f}), plain DDP {p * 1e3:.2f} ms/step", file=sys.stderr)
    emit({"ratio": statistics.median(ts_ratios), "run_api_ratio": statistics.median(api_ratios),
          "ratio_spread": spread(ts_ratios), "run_api_ratio_spread": spread(api_ratios),
          "trainscale_step_s": ts, "run_api_step_s": api, "plain_step_s": plain,
          "trainscale_spread": spread(r["ts"]), "run_api_spread": spread(r["api"]),
          "plain_spread": spread(r["plain"]), "rounds": a.rounds})


if __name__ == "__main__":
    main()
