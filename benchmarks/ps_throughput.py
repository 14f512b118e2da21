"""Updates per second of trainscale's ``async`` parameter server against Ray's own parameter-server pattern.

The alternative is the pattern of Ray's parameter-server example, written here: one server actor that
holds a torch model and its optimizer, learners that return their gradients as a list of arrays, and a
driver that loops on ``ray.wait`` and hands each gradient straight to the server and the new weights
straight back to the learner. Same model, same data, same P, same batch size, no injected delay, in the
same Ray instance; the rounds alternate which one runs first. Both are timed the same way: from before
the first mini-batch is launched to the moment the last update is handed to the server(s). The last line
of stdout is one JSON object.

    python benchmarks/ps_throughput.py [--learners 4] [--updates 400] [--repeats 3] [--shards 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import ray
import torch
from _common import spread

from trainscale.config import DataConfig, load_config
from trainscale.data import build_datasets
from trainscale.models import build_model

WIDTH, BATCH, LR = 64, 32, 0.05


def _model(info, width: int = WIDTH, depth: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", info.in_shape, info.num_classes, width, depth)


@ray.remote(num_cpus=0)
class ExampleServer:
    """The server of the pattern: a whole model and an optimizer in one actor."""

    def __init__(self, info, width: int = WIDTH, depth: int = 2):
        torch.set_num_threads(1)
        self.model = _model(info, width, depth)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR)

    def apply_gradients(self, *grads: list[np.ndarray]) -> list[np.ndarray]:
        summed = [np.sum(parts, axis=0) for parts in zip(*grads)]
        self.opt.zero_grad()
        for p, g in zip(self.model.parameters(), summed):
            p.grad = torch.from_numpy(g)
        self.opt.step()
        return self.get_weights()

    def get_weights(self) -> list[np.ndarray]:
        return [p.detach().numpy().copy() for p in self.model.parameters()]


@ray.remote(num_cpus=0)
class ExampleWorker:
    """A learner of the pattern: weights in, gradients out, on its own slice of the data."""

    def __init__(self, rank: int, world: int, images: np.ndarray, labels: np.ndarray, info, width: int = WIDTH,
                 depth: int = 2):
        torch.set_num_threads(1)
        self.model = _model(info, width, depth)
        own = np.arange(rank, len(labels), world)
        self.images, self.labels = torch.from_numpy(images[own]), torch.from_numpy(labels[own])
        self.mean = torch.tensor(info.mean).view(1, -1, 1, 1)
        self.std = torch.tensor(info.std).view(1, -1, 1, 1)
        self.rng = np.random.default_rng(rank)

    def compute_gradients(self, weights: list[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            for p, w in zip(self.model.parameters(), weights):
                p.copy_(torch.from_numpy(w))
        idx = torch.from_numpy(self.rng.integers(0, len(self.labels), BATCH))
        x = (self.images[idx].float() - self.mean) / self.std
        self.model.zero_grad()
        torch.nn.functional.cross_entropy(self.model(x), self.labels[idx]).backward()
        return [p.grad.numpy() for p in self.model.parameters()]


def ray_example_async(server, workers, updates: int, timeout_s: float = 60.0) -> float:
    """The example's asynchronous loop; returns updates per second (first launch to last update handed over)."""
    t0 = time.perf_counter()
    weights = server.get_weights.remote()
    inflight = {w.compute_gradients.remote(weights): w for w in workers}
    for _ in range(updates):
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=timeout_s)
        if not ready:
            raise TimeoutError("no gradient within the timeout")
        worker = inflight.pop(ready[0])
        weights = server.apply_gradients.remote(ready[0])
        inflight[worker.compute_gradients.remote(weights)] = worker
    elapsed = time.perf_counter() - t0
    ray.get([weights, *inflight], timeout=timeout_s)  # nothing left running into the next round
    return updates / elapsed


def trainscale_async(actors, learners: int, updates: int, shards: int = 1) -> float:
    """trainscale's ``async`` mode on the same model; returns updates per second, timed as the example's."""
    from trainscale.ps.job import run_ps

    cfg = load_config(["--ps.mode", "async", "--ps.learners", str(learners), "--ps.steps", str(updates),
                       "--ps.shards", str(shards), "--model.width", str(WIDTH), "--data.batch_size", str(BATCH),
                       "--ps.lr", str(LR), "--log.progress", "none"])
    s = run_ps(cfg, actors=actors)
    return s["updates"] / s["timeline"][-1]["t"]  # t: seconds from the first launch to this update


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--learners", type=int, default=4)
    ap.add_argument("--updates", type=int, default=400)
    ap.add_argument("--shards", type=int, default=1, help="trainscale's server shards (the example has one server)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating measured rounds; the median is reported")
    args = ap.parse_args()
    from trainscale.ps.actors import PsActors

    train, _, info = build_datasets(DataConfig(name="digits"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    ours, theirs = [], []
    try:
        images, labels = train.images.numpy(), train.labels.numpy()
        server = ExampleServer.remote(info)
        workers = [ExampleWorker.remote(r, args.learners, images, labels, info) for r in range(args.learners)]
        actors = PsActors(args.learners, args.shards)
        try:
            ray_example_async(server, workers, 50)  # warm-up: actors started, first calls done
            trainscale_async(actors, args.learners, 50, args.shards)
            for r in range(args.repeats):
                # Alternate which goes first, so a drift of the machine's load favours neither.
                for name in (("trainscale", "example") if r % 2 == 0 else ("example", "trainscale")):
                    if name == "trainscale":
                        ours.append(trainscale_async(actors, args.learners, args.updates, args.shards))
                    else:
                        theirs.append(ray_example_async(server, workers, args.updates))
                print(f"round {r}: trainscale async {ours[-1]:.1f} updates/s, Ray example pattern "
                      f"{theirs[-1]:.1f} updates/s, ratio {ours[-1] / theirs[-1]:.3f} "
                      f"(P={args.learners}, S={args.shards}, {args.updates} updates)", flush=True)
        finally:
            actors.close()
            for a in [server, *workers]:
                ray.kill(a)
    finally:
        ray.shutdown()
    ratios = [o / t for o, t in zip(ours, theirs)]
    t, e = statistics.median(ours), statistics.median(theirs)
    print(json.dumps({"trainscale_updates_s": round(t, 2), "ray_example_updates_s": round(e, 2),
                      "ratio": round(statistics.median(ratios), 3), "ratios": [round(x, 3) for x in ratios],
                      "ratio_spread": round(spread(ratios), 3), "trainscale_rounds": [round(x, 1) for x in ours],
                      "example_rounds": [round(x, 1) for x in theirs], "learners": args.learners,
                      "shards": args.shards, "updates": args.updates}))


if __name__ == "__main__":
    main()
