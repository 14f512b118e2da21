"""The input pipeline on a GPU: what travels to the device, and what the side-stream prefetch buys.

1. ``uint8`` batches normalised on the device (trainscale's path) against ``float32`` batches normalised
   on the host in the workers (common practice): bytes per batch copied host-to-device, training
   samples/s, the loader's own samples/s and the data-wait fraction, same model, same images.
2. The data-wait fraction and samples/s with the side-stream prefetch (``--data.prefetch 2``: a thread
   copies batch i+1 on its own CUDA stream while batch i computes) and without it (``--data.prefetch 0``:
   copy and normalise in the training thread, on the compute stream), on a job made input-bound on
   purpose (one worker, ``--data.sample_delay_ms``).

Each configuration runs in its own process, alternating order over rounds. Last stdout line: one JSON object.

    PYTHONPATH=src python benchmarks/gpu_input.py [--rounds 2] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parents[1] / "src"


class HostNormalized:
    """The common loader: each sample cast to float32 and normalised on the host, in the workers."""

    def __init__(self, base, mean, std):  # noqa: ANN001 - a TensorImages and two tuples
        import torch
        self.base = base
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.inv_std = 1.0 / torch.tensor(std).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):  # noqa: ANN204
        x, y = self.base[i]
        return (x.float() - self.mean) * self.inv_std, y


def child(args: argparse.Namespace, variant: str, out: Path) -> None:
    """Run one configuration in this process and write its summary (plus bytes per batch) to ``out``."""
    sys.path.insert(0, str(SRC))
    from trainscale.config import load_config
    from trainscale.data import build_datasets
    from trainscale.train.trainer import Trainer

    argv = ["--model.name", args.model, "--data.name", "synthetic", "--data.image_size", str(args.size),
            "--data.train_size", str(args.train_size), "--data.eval_size", "0", "--data.batch_size",
            str(args.batch_size), "--job.steps", str(args.steps), "--log.skip_first", "10", "--log.progress", "none",
            "--strategy.amp", args.amp, "--job.device", args.device]
    if variant in ("uint8", "float32"):
        argv += ["--data.workers", str(args.workers)]
    else:  # input-bound on purpose: one worker, a storage delay per sample
        argv += ["--data.workers", "1", "--data.sample_delay_ms", str(args.delay_ms),
                 "--data.prefetch", "2" if variant == "prefetch" else "0"]
    cfg = load_config(argv)
    train, _, info = build_datasets(cfg.data)
    x0, _ = train[0]
    if variant == "float32":
        train = HostNormalized(train, info.mean, info.std)
        bytes_per_batch = x0.numel() * 4 * args.batch_size
    else:
        bytes_per_batch = x0.numel() * x0.element_size() * args.batch_size
    s = Trainer(cfg, train_data=train, data_info=info).fit()
    out.write_text(json.dumps({"samples_per_s": s["samples_per_s"], "data_wait_frac": s["data_wait_frac"],
                               "data_samples_per_s": s["data_samples_per_s"], "bytes_per_batch": bytes_per_batch}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--train-size", type=int, default=4096)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--amp", default="bf16")
    p.add_argument("--delay-ms", type=float, default=0.2, help="per-sample storage delay of the input-bound job")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default="cuda")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--child-out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args, args.child, Path(args.child_out))
        return
    results: dict[str, list[dict]] = {v: [] for v in ("uint8", "float32", "prefetch", "no_prefetch")}
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for pair in (("uint8", "float32"), ("prefetch", "no_prefetch")):
                for v in pair if r % 2 == 0 else pair[::-1]:
                    out = Path(tmp) / f"{v}_{r}.json"
                    subprocess.run([sys.executable, str(HERE), *sys.argv[1:], "--child", v, "--child-out", str(out)],
                                   check=True, env=env, timeout=900)
                    results[v].append(json.loads(out.read_text()))
                    print(f"round {r} {v}: {results[v][-1]}", flush=True)

    def med(v: str, key: str) -> float:
        return statistics.median(x[key] for x in results[v])

    summary = {v: {k: med(v, k) for k in ("samples_per_s", "data_wait_frac", "data_samples_per_s", "bytes_per_batch")}
               for v in results}
    summary["uint8_over_float32_samples_per_s"] = med("uint8", "samples_per_s") / med("float32", "samples_per_s")
    summary["prefetch_over_none_samples_per_s"] = med("prefetch", "samples_per_s") / med("no_prefetch", "samples_per_s")
    print(json.dumps({"model": args.model, "batch_size": args.batch_size, "size": args.size, "rounds": results,
                      "median": summary}))


if __name__ == "__main__":
    main()
