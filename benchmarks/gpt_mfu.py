"""The GPT example's reported MFU against an independent count: FlopCounterMode FLOPs over CUDA-event time.

Runs ``examples/gpt.py`` on one process and reads its run summary (``flops_per_step``, ``step_time_s``,
``peak_flops``, ``mfu``). Then, in this process, trains the same model shape on the same batch and micro-steps
with the same precision (fp16 autocast and a loss scaler on CUDA, bf16 on a CPU) in a plain loop: FLOPs of one
optimizer step counted by ``torch.utils.flop_counter.FlopCounterMode``, each step timed between two CUDA events
(a CPU: ``perf_counter``), the median over the same number of measured steps. Both MFUs use the run's peak.
Last stdout line: one JSON object.

    PYTHONPATH=src python benchmarks/gpt_mfu.py [--layers 12 --heads 12 --width 768 --block 1024 --batch-size 8]
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]
GPT_PY = REPO / "examples" / "gpt.py"


def load_example() -> SimpleNamespace:
    """examples/gpt.py's names (its GPT, text and loss), without running its main."""
    return SimpleNamespace(**runpy.run_path(str(GPT_PY), run_name="gpt_example"))


def run_example(a: argparse.Namespace, shape: list[str]) -> dict:
    """One process of the example; its run summary."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s.json"
        env = {**os.environ, "TRAINSCALE_JSON": str(out), "PYTHONPATH": str(REPO / "src")}
        cmd = [sys.executable, str(GPT_PY), *shape, "--steps", str(a.steps), "--sample", "0", "--eval-batches", "2",
               "--log.progress", "none", "--log.skip_first", str(a.warmup)]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            sys.exit(f"examples/gpt.py failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
        return json.loads(out.read_text())


def plain_loop(a: argparse.Namespace, vocab: int) -> tuple[float, float]:
    """(FLOPs of one optimizer step, median step seconds) of the same model and batch in a hand-written loop."""
    from torch.utils.flop_counter import FlopCounterMode

    ex = load_example()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    model = ex.GPT(vocab, a.block, a.layers, a.heads, a.width, 0.0).to(dev)
    opt = torch.optim.AdamW(ex.param_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.95))
    dtype = torch.float16 if cuda else torch.bfloat16
    scaler = torch.amp.GradScaler(dev.type, enabled=cuda)
    n = a.batch_size * a.accum
    x = torch.randint(vocab, (n, a.block), device=dev)
    y = torch.randint(vocab, (n, a.block), device=dev)

    def step() -> None:
        for xm, ym in zip(x.chunk(a.accum), y.chunk(a.accum)):
            with torch.autocast(dev.type, dtype=dtype):
                loss = ex.next_token_loss(model(xm), ym) / a.accum
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    with FlopCounterMode(display=False) as counter:
        step()
    flops = float(counter.get_total_flops())
    # Events recorded around each step and read at the end: no sync between steps, so the host runs ahead of
    # the GPU as it does in the run (a sync per step would add the launch gap to every step).
    measured = a.steps - a.warmup
    if cuda:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(measured)]
        for t0, t1 in ev:
            t0.record()
            step()
            t1.record()
        torch.cuda.synchronize()
        times = [t0.elapsed_time(t1) / 1e3 for t0, t1 in ev]
    else:
        times = []
        for _ in range(measured):
            s = time.perf_counter()
            step()
            times.append(time.perf_counter() - s)
    return flops, statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)  # GPT-2 small's shape (its vocabulary aside: 36 characters)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per micro-step")
    ap.add_argument("--accum", type=int, default=2, help="micro-steps per optimizer step")
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps of each side")
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of each side's median")
    a = ap.parse_args()
    if a.steps <= a.warmup:
        ap.error(f"--steps {a.steps} must exceed --warmup {a.warmup}")
    shape = ["--layers", str(a.layers), "--heads", str(a.heads), "--width", str(a.width), "--block", str(a.block),
             "--batch-size", str(a.batch_size), "--accum", str(a.accum)]
    s = run_example(a, shape)
    ex = load_example()
    vocab = len(set(ex.make_text(200_000, 0) + ex.make_text(20_000, 1)))  # the example's default --chars
    flops, step_s = plain_loop(a, vocab)
    mfu = flops / step_s / s["peak_flops"]
    print(f"run API:     {s['flops_per_step']:.4g} FLOP/step, step {s['step_time_s'] * 1e3:.2f} ms, MFU "
          f"{100 * s['mfu']:.2f}%  (peak {s['peak_flops']:.4g} FLOP/s, {s['peak_flops_source']})")
    print(f"independent: {flops:.4g} FLOP/step, step {step_s * 1e3:.2f} ms, MFU {100 * mfu:.2f}%", flush=True)
    print(json.dumps({"device": s["device"], "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "",
                      "mfu_run": s["mfu"], "mfu_independent": mfu, "difference_points": 100 * (s["mfu"] - mfu),
                      "flops_run": s["flops_per_step"], "flops_independent": flops, "step_s_run": s["step_time_s"],
                      "step_s_independent": step_s, "peak_flops": s["peak_flops"],
                      "peak_flops_source": s["peak_flops_source"], "steps": a.steps, "warmup": a.warmup,
                      "shape": shape}))


if __name__ == "__main__":
    main()
