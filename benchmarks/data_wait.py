"""How long training steps wait for data: the plain DataLoader against trainscale's loader, same model, same run.

A short single-process training run (``trainscale.Trainer``) on a generated JPEG folder with a model cheap
enough for the input to matter, once fed by the plain loader of common practice (Pillow decode + float
conversion + normalisation in workers, a new iterator each epoch) and once by trainscale's loader (packed
uint8 shards, persistent workers, background prefetch, normalisation on the device). ``data_wait_frac``
and throughput come from each run's summary. Last stdout line: one JSON object.

    PYTHONPATH=src python benchmarks/data_wait.py [--images 1024] [--steps 60] [--workers 1]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _images import PlainFolder, cores, make_jpeg_folder  # noqa: E402

from trainscale.config import load_config  # noqa: E402
from trainscale.data.packed import pack_folder  # noqa: E402
from trainscale.distributed.env import shutdown  # noqa: E402
from trainscale.train.trainer import Trainer  # noqa: E402


class PlainLoader:
    """The common loop's loader behind the trainer's interface: float batches from workers, epoch by epoch."""

    def __init__(self, root: Path, size: int, batch: int, workers: int):
        self.dl = DataLoader(PlainFolder(root, size), batch_size=batch, shuffle=True, num_workers=workers)
        self.it = iter(self.dl)
        self.skipped, self.samples, self.busy = 0, 0, 0.0

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        try:
            x, y = next(self.it)
        except StopIteration:  # a new epoch: new iterator, new workers, an empty queue to refill
            self.it = iter(self.dl)
            x, y = next(self.it)
        self.busy += time.perf_counter() - t0
        self.samples += len(y)
        return x, y

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.busy

    def state_dict(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        self.it = iter(())


class PlainTrainer(Trainer):
    def __init__(self, cfg: Any, root: Path, workers: int):
        super().__init__(cfg)
        self.root, self.plain_workers = root, workers

    def training_data(self) -> PlainLoader:
        c = self.cfg.data
        return PlainLoader(self.root, c.image_size, c.batch_size, self.plain_workers)


def run(trainer: Trainer) -> dict[str, Any]:
    try:
        return trainer.fit()
    finally:
        shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--side", type=int, default=160)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--width", type=int, default=8)
    args = ap.parse_args()
    faulthandler.dump_traceback_later(1200, exit=True)  # a stalled run prints every thread's stack, never hangs
    os.environ.setdefault("TRAINSCALE_TABLE_PRINTED", "1")
    with tempfile.TemporaryDirectory() as tmp:
        root = make_jpeg_folder(Path(tmp) / "jpeg", args.images, args.side)
        pack_folder(str(root), str(Path(tmp) / "pack"), args.side, workers=args.workers)

        def cfg(name: str, path: Path) -> Any:
            return load_config([
                "--data.name", name, "--data.path", str(path), "--data.image_size", str(args.size),
                "--data.batch_size", str(args.batch), "--data.workers", str(args.workers), "--data.prefetch", "2",
                "--model.name", args.model, "--model.width", str(args.width), "--job.steps", str(args.steps),
                "--job.threads", "1", "--log.progress", "none", "--log.every", "20", "--log.skip_first", "5"])

        plain = run(PlainTrainer(cfg("imagefolder", root), root, args.workers))
        ours = run(Trainer(cfg("packed", Path(tmp) / "pack")))
        # The model's own step time with no loading at all (--ablate.data): what the loaders are measured against.
        c = cfg("packed", Path(tmp) / "pack")
        c.ablate.data = True
        compute = run(Trainer(c))

    def brief(s: dict[str, Any]) -> dict[str, float]:
        return {k: round(s[k], 4) for k in ("data_wait_frac", "samples_per_s", "data_samples_per_s", "step_time_s")}

    detail = {"plain": brief(plain), "trainscale": brief(ours), "compute_only": brief(compute)}
    print(json.dumps(detail, indent=1), flush=True)
    result = {"plain_data_wait_frac": round(plain["data_wait_frac"], 4),
              "trainscale_data_wait_frac": round(ours["data_wait_frac"], 4),
              "plain_samples_per_s": round(plain["samples_per_s"], 1),
              "trainscale_samples_per_s": round(ours["samples_per_s"], 1),
              "compute_only_samples_per_s": round(compute["samples_per_s"], 1),
              "model": f"{args.model} width {args.width}", "image_size": args.size, "batch": args.batch,
              "steps": args.steps, "workers": args.workers, "cores": cores()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
