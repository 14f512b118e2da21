"""One-process step cost: ``trainscale train`` against a hand-written plain PyTorch loop, same model and batch.

Both run resnet50 (full width by default) on the same synthetic uint8 224x224 images, batch 64, in
their own process, alternating which goes first in each round, for each precision (fp32, bf16,
fp16). The plain loop is what a careful engineer writes: a DataLoader with pinned memory, a
non-blocking copy, normalisation on the device, autocast and a GradScaler for fp16,
``cudnn.benchmark`` on, the loss read every 20 steps. Both report samples/s the same way: measured
steps x batch / the sum of their step intervals, warm-up excluded. Last stdout line: one JSON object.

    PYTHONPATH=src python benchmarks/gpu_step.py [--model resnet50] [--steps 80] [--rounds 2] [--amp fp32,bf16,fp16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parents[1] / "src"


def plain_loop(args: argparse.Namespace) -> float:
    """The hand-written loop; returns samples/s over the measured steps."""
    sys.path.insert(0, str(SRC))
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from trainscale.config import load_config
    from trainscale.data import build_datasets
    from trainscale.models import build_model

    cfg = load_config(_data_args(args))
    train, _, info = build_datasets(cfg.data)  # the very same images trainscale reads
    dev = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = build_model(args.model, info.in_shape, info.num_classes, args.width, 2).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    amp = args.amp if args.amp != "fp32" else "none"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    scaler = torch.amp.GradScaler(dev.type, enabled=amp == "fp16")
    mean = torch.tensor(info.mean, device=dev).view(1, -1, 1, 1)
    std = torch.tensor(info.std, device=dev).view(1, -1, 1, 1)
    loader = DataLoader(TensorDataset(train.images, train.labels), batch_size=args.batch_size, shuffle=True, pin_memory=dev.type == "cuda",
                        drop_last=True, num_workers=args.workers, persistent_workers=args.workers > 0)
    it, intervals, t_prev = iter(loader), [], time.perf_counter()
    for step in range(args.steps):
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        x = (x.to(dev, non_blocking=True).float() - mean) / std
        y = y.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % 20 == 0:
            loss.item()  # logging, as trainscale does every log.every steps
        now = time.perf_counter()
        if step >= args.warmup:
            intervals.append(now - t_prev)
        t_prev = now
    return len(intervals) * args.batch_size / sum(intervals)


def _data_args(args: argparse.Namespace) -> list[str]:
    return ["--data.name", "synthetic", "--data.image_size", str(args.size), "--data.train_size", str(args.train_size),
            "--data.eval_size", "0", "--data.num_classes", "100", "--data.batch_size", str(args.batch_size),
            "--data.workers", str(args.workers)]


def trainscale_run(args: argparse.Namespace, folder: Path) -> float:
    """``trainscale train`` with the same job; returns its summary's samples/s."""
    out = folder / f"ts_{args.amp}_{time.monotonic_ns()}.json"
    cmd = [sys.executable, "-m", "trainscale", "train", "--model", args.model, "--model.width", str(args.width),
           *_data_args(args), "--job.steps", str(args.steps), "--job.device", args.device,
           "--log.skip_first", str(args.warmup), "--log.progress", "none", "--optim.lr", "0.01",
           "--strategy.amp", "none" if args.amp == "fp32" else args.amp, "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run(cmd, check=True, env=env, timeout=900)
    return json.loads(out.read_text())["samples_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--width", type=int, default=0, help="0: the model's full width")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--train-size", type=int, default=2048)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--amp", default="fp32,bf16,fp16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.plain_child:
        print(json.dumps({"samples_per_s": plain_loop(args)}))
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for amp in args.amp.split(","):
            args.amp = amp
            ts, plain = [], []
            for r in range(args.rounds):
                order = ("ts", "plain") if r % 2 == 0 else ("plain", "ts")
                for who in order:
                    if who == "ts":
                        ts.append(trainscale_run(args, Path(tmp)))
                    else:
                        argv = [a for a in sys.argv[1:]]
                        child = subprocess.run([sys.executable, str(HERE), *argv, "--amp", amp, "--plain-child"],
                                               check=True, capture_output=True, text=True, timeout=900)
                        plain.append(json.loads(child.stdout.strip().splitlines()[-1])["samples_per_s"])
                    print(f"{amp} round {r} {who}: {(ts if who == 'ts' else plain)[-1]:.1f} samples/s", flush=True)
            ratios = [a / b for a, b in zip(ts, plain)]
            results[amp] = {"trainscale_samples_per_s": ts, "plain_samples_per_s": plain,
                            "ratio_median": statistics.median(ratios), "ratios": ratios}
    print(json.dumps({"model": args.model, "batch_size": args.batch_size, "size": args.size,
                      "device": args.device, "results": results}))


if __name__ == "__main__":
    main()
