"""Images/s of three input pipelines on one generated JPEG folder, and bytes per batch handed to the device.

(a) plain: torch DataLoader, Pillow decode + float conversion + normalisation in workers (common practice);
(b) trainscale's loader from the folder (uint8 in workers, fastest installed decoder, normalised on the device);
(c) trainscale's loader from packed uint8 shards (``trainscale data pack``), read by memory map.
Each pipeline is timed over whole epochs after a warm-up batch, in interleaved rounds; the median and the
relative spread ((max - min) / median) of the rounds are reported. Last stdout line: one JSON object.

    PYTHONPATH=src python benchmarks/loader.py [--images 2000] [--side 160] [--size 128] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _images import PlainFolder, cores, make_jpeg_folder, median_spread  # noqa: E402

from trainscale.config import DataConfig  # noqa: E402
from trainscale.data import TrainLoader, build_datasets  # noqa: E402
from trainscale.data.decode import resolve_decoder  # noqa: E402
from trainscale.data.packed import pack_folder  # noqa: E402


def time_plain(root: Path, args: argparse.Namespace) -> float:
    dl = DataLoader(PlainFolder(root, args.size), batch_size=args.batch, shuffle=True, num_workers=args.workers,
                    persistent_workers=False)
    it = iter(dl)  # the usual loop: a new iterator (and new workers) each epoch
    next(it)
    t0, n = time.perf_counter(), 0
    for x, _ in it:
        n += len(x)
    return n / (time.perf_counter() - t0)


def time_trainscale(name: str, path: Path, args: argparse.Namespace) -> float:
    train, _, info = build_datasets(DataConfig(name=name, path=str(path), image_size=args.size))
    loader = TrainLoader(train, info, torch.device("cpu"), args.batch, workers=args.workers, prefetch=2)
    next(loader)
    t0, n = time.perf_counter(), 0
    for _ in range(loader.batches_per_epoch - 1):
        x, _ = next(loader)
        n += len(x)
    rate = n / (time.perf_counter() - t0)
    loader.close()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--side", type=int, default=160, help="side of the generated JPEGs")
    ap.add_argument("--size", type=int, default=128, help="side of the crops the model sees")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_jpeg_folder(Path(tmp) / "jpeg", args.images, args.side)
        t0 = time.perf_counter()
        pack_folder(str(root), str(Path(tmp) / "pack"), args.side, workers=args.workers)
        pack_s = time.perf_counter() - t0
        rates: dict[str, list[float]] = {"plain": [], "folder": [], "packed": []}
        for r in range(args.rounds):
            rates["plain"].append(time_plain(root, args))
            rates["folder"].append(time_trainscale("imagefolder", root, args))
            rates["packed"].append(time_trainscale("packed", Path(tmp) / "pack", args))
            print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1]:.0f} img/s" for k, v in rates.items()), flush=True)
    stats = {k: median_spread(v) for k, v in rates.items()}
    px = args.batch * 3 * args.size * args.size
    result = {
        "plain_img_s": round(stats["plain"][0], 1), "folder_img_s": round(stats["folder"][0], 1),
        "packed_img_s": round(stats["packed"][0], 1),
        "speedup_folder_vs_plain": round(stats["folder"][0] / stats["plain"][0], 2),
        "speedup_packed_vs_plain": round(stats["packed"][0] / stats["plain"][0], 2),
        "speedup_packed_vs_plain_rounds": [round(p / q, 2) for p, q in zip(rates["packed"], rates["plain"])],
        "spread": {k: round(v[1], 3) for k, v in stats.items()},
        "bytes_per_batch_float32": px * 4, "bytes_per_batch_uint8": px,
        "decoder": resolve_decoder("auto"), "images": args.images, "side": args.side, "size": args.size,
        "batch": args.batch, "workers": args.workers, "rounds": args.rounds, "cores": cores(),
        "pack_s": round(pack_s, 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
