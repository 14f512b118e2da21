"""The step of a GPT-2-small-shaped model: plain PyTorch, accelerate, Lightning Fabric and the run API, bf16.

The same loop four ways, each in a worker process of its own that builds its model once (and compiles it with
``--compile``, before wrapping it, in every loop): ``examples/gpt.py``'s model, bf16 autocast, fused AdamW,
gradient clipping at 1.0, random tokens copied from pinned host memory each step (a CPU: plain host memory), the
loss computed as the README writes it (``loss_fn(model(x), y)``). The plain loop autocasts the forward and the
loss; accelerate runs ``Accelerator(mixed_precision="bf16")``, Fabric ``precision="bf16-mixed"``, the run API
``--strategy.amp bf16`` at world size 1. Rounds alternate between the workers (the order rotates each round);
each round is warm-up steps, then timed steps between two device syncs. accelerate and Fabric are skipped, and
the JSON says why, where they do not import.

    python benchmarks/step_gpu.py                      # GPT-2 small on a GPU (12 x 768, context 1024, vocabulary 50304)
    python benchmarks/step_gpu.py --compile            # torch.compile(model) before each loop wraps it
    python benchmarks/step_gpu.py --shape small        # a small shape: the default on a CPU

Last stdout line: one JSON object (ms/step per loop, each round, ratios to the plain loop, spreads).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
SHAPES = {"gpt2": {"layers": 12, "heads": 12, "width": 768, "block": 1024, "vocab": 50304, "batch": 16},
          "small": {"layers": 2, "heads": 2, "width": 64, "block": 64, "vocab": 2048, "batch": 8}}
LOOPS = ("plain", "accelerate", "fabric", "run_api")
CLIP = 1.0


# ---------------------------------------------------------------- a worker: one loop, stepped on request


def load_gpt() -> Any:
    """``examples/gpt.py`` as a module (dynamo reads a traced function's module from sys.modules)."""
    spec = importlib.util.spec_from_file_location("example_gpt", HERE.parents[1] / "examples" / "gpt.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tokens(shape: dict[str, int], device: Any) -> Callable[[], tuple[Any, Any]]:
    """A batch function: the next of 8 random-token batches, copied from (pinned) host memory to ``device``."""
    import torch

    g = torch.Generator().manual_seed(0)
    host = torch.randint(shape["vocab"], (8, shape["batch"], shape["block"] + 1), generator=g)
    host = host.pin_memory() if device.type == "cuda" else host
    i = 0

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal i
        ids = host[i % len(host)].to(device, non_blocking=True)
        i += 1
        return ids[:, :-1], ids[:, 1:]

    return get_batch


def build(loop: str, shape: dict[str, int], device: Any, compiled: bool) -> Callable[[], None]:
    """The loop's model, optimizer and one step (data, forward, loss, backward, clip, optimizer, zero_grad)."""
    import torch

    if loop == "fabric":
        import lightning.fabric  # noqa: F401 - before torch.compile: Fabric records the compile's arguments to redo it

    gpt = load_gpt()
    torch.manual_seed(0)
    model = gpt.GPT(shape["vocab"], shape["block"], shape["layers"], shape["heads"], shape["width"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), fused=True)
    if compiled:
        model = torch.compile(model)
    get_batch, loss_fn = tokens(shape, device), gpt.next_token_loss
    return {"plain": plain_step, "accelerate": accelerate_step, "fabric": fabric_step,
            "run_api": run_api_step}[loop](model, opt, get_batch, loss_fn, device)


def plain_step(model: Any, opt: Any, get_batch: Callable, loss_fn: Callable, device: Any) -> Callable[[], None]:
    import torch

    def step() -> None:
        x, y = get_batch()
        with torch.autocast(device.type, dtype=torch.bfloat16):  # the forward and the loss, as PyTorch's recipe
            loss = loss_fn(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def accelerate_step(model: Any, opt: Any, get_batch: Callable, loss_fn: Callable, device: Any) -> Callable[[], None]:
    from accelerate import Accelerator

    acc = Accelerator(mixed_precision="bf16", cpu=device.type == "cpu")
    model, opt = acc.prepare(model, opt)

    def step() -> None:
        x, y = get_batch()
        loss = loss_fn(model(x), y)
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def fabric_step(model: Any, opt: Any, get_batch: Callable, loss_fn: Callable, device: Any) -> Callable[[], None]:
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator=device.type, devices=1, precision="bf16-mixed")
    model, opt = fabric.setup(model, opt)

    def step() -> None:
        x, y = get_batch()
        loss = loss_fn(model(x), y)
        fabric.backward(loss)
        fabric.clip_gradients(model, opt, max_norm=CLIP, error_if_nonfinite=False)  # no host sync, as the others
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def run_api_step(model: Any, opt: Any, get_batch: Callable, loss_fn: Callable, device: Any) -> Callable[[], None]:
    import trainscale

    run = trainscale.init(args=["--strategy.amp", "bf16", "--log.progress", "none", "--job.device", device.type])
    prepared, opt, _ = run.prepare(model, opt)
    batches = iter(run.batches(get_batch, steps=1 << 30))

    def step() -> None:
        x, y = next(batches)
        run.backward(loss_fn(prepared(x), y))
        run.clip_gradients(CLIP)
        run.step()

    return step


def worker(loop: str, shape: dict[str, int], device_name: str, compiled: bool) -> None:
    """Answer each ``WARMUP STEPS`` line on stdin with the ms/step of STEPS timed steps (a JSON line)."""
    import torch

    answers = os.fdopen(os.dup(1), "w")  # the parent reads this; whatever else prints goes to stderr
    os.dup2(2, 1)
    device = torch.device(device_name)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    step = build(loop, shape, device, compiled)
    print(json.dumps({"ready": loop}), file=answers, flush=True)
    for line in sys.stdin:
        warmup, steps = (int(v) for v in line.split())
        for _ in range(warmup):
            step()
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        print(json.dumps({"ms": (time.perf_counter() - t0) / steps * 1e3}), file=answers, flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the next worker's round gets the memory back


# ---------------------------------------------------------------- the parent: alternating rounds


def missing(loop: str) -> str | None:
    """Why ``loop`` cannot run here (its package does not import), else None."""
    package = {"accelerate": "accelerate", "fabric": "lightning.fabric"}.get(loop)
    if package is None:
        return None
    try:
        importlib.import_module(package)
    except Exception as e:  # noqa: BLE001 - any import failure means the loop is skipped, with the reason
        return f"not importable: {type(e).__name__}: {e}"
    return None


class Worker:
    """A worker process for one loop, talking one JSON line per request."""

    def __init__(self, loop: str, argv: list[str]):
        self.loop = loop
        self.proc = subprocess.Popen([sys.executable, str(HERE), "--worker", loop, *argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        try:
            self.read()  # built (and, with --compile, wrapped) before the first round
        except BaseException:
            self.close()
            raise

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.loop} worker ended (exit {self.proc.wait()}): see its stderr above")
        return json.loads(line)

    def round(self, warmup: int, steps: int) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{warmup} {steps}\n")
        self.proc.stdin.flush()
        return float(self.read()["ms"])

    def close(self) -> None:
        """End of stdin ends the worker; one that does not end in 2 minutes is killed."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def measure(args: argparse.Namespace, argv: list[str], loops: list[str]) -> dict[str, list[float]]:
    """Each loop's ms/step per round; the order rotates so that no loop always runs first."""
    workers: list[Worker] = []
    times: dict[str, list[float]] = {loop: [] for loop in loops}
    try:
        for loop in loops:
            workers.append(Worker(loop, argv))
        for r in range(args.rounds):
            k = r % len(workers)
            for w in workers[k:] + workers[:k]:
                times[w.loop].append(w.round(args.warmup if r else args.warmup + args.first_warmup, args.steps))
                print(f"round {r + 1}: {w.loop} {times[w.loop][-1]:.2f} ms/step", file=sys.stderr, flush=True)
    finally:
        for w in workers:
            w.close()
    return times


def parse() -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--shape", choices=["auto", *SHAPES], default="auto", help="auto: gpt2 on a GPU, small on a CPU")
    ap.add_argument("--compile", action="store_true", help="torch.compile(model) before each loop wraps it")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per round")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before each round's timed ones")
    ap.add_argument("--first-warmup", type=int, default=5, help="more untimed steps in the first round (compile)")
    ap.add_argument("--loops", default=",".join(LOOPS), help="comma-separated subset of " + ",".join(LOOPS))
    ap.add_argument("--worker", choices=LOOPS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("rounds", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} = {getattr(args, name)}: must be >= 1")
    unknown = [loop for loop in args.loops.split(",") if loop not in LOOPS]
    if unknown or "plain" not in args.loops.split(","):
        ap.error(f"--loops {args.loops}: a comma-separated subset of {','.join(LOOPS)} that includes plain")
    if args.device == "auto":
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.shape == "auto":
        args.shape = "gpt2" if args.device == "cuda" else "small"
    argv = ["--device", args.device, "--shape", args.shape] + (["--compile"] if args.compile else [])
    return args, argv


def main() -> None:
    args, argv = parse()
    if args.worker:
        worker(args.worker, SHAPES[args.shape], args.device, args.compile)
        return
    sys.path.insert(0, str(HERE.parent))
    from _common import emit, spread

    skipped = {loop: why for loop in args.loops.split(",") if (why := missing(loop))}
    loops = [loop for loop in args.loops.split(",") if loop not in skipped]
    times = measure(args, argv, loops)
    ms = {loop: statistics.median(v) for loop, v in times.items()}
    emit({"device": args.device, "shape": args.shape, **SHAPES[args.shape], "amp": "bf16", "compile": args.compile,
          "rounds": args.rounds, "steps": args.steps, "ms_per_step": ms,
          "ratio_to_plain": {loop: ms[loop] / ms["plain"] for loop in loops},
          "spread": {loop: spread(v) for loop, v in times.items()}, "rounds_ms": times, "skipped": skipped})


if __name__ == "__main__":
    main()
