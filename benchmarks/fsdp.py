"""FSDP2 (``strategy.fsdp``) against DDP in the same run: step time and peak memory per rank.

Output contract: the last stdout line is one json object, with ``step_ratio`` (FSDP / DDP, median of the rounds'
ratios, and its spread) and ``memory_ratio`` (FSDP / DDP of the fullest rank's peak memory, median over rounds).

The job: an mlp of ``--depth`` hidden layers of ``--width`` units (2048 x 4: 12.7 M parameters, 51 MB of fp32)
on digits, AdamW (two moments per parameter: the state FSDP shards), 32 samples per process, 2 Gloo processes.
Each run is its own ``trainscale launch`` (fresh processes: a process that ran one training keeps some of its
memory, which would count in the next run's peak), the variants alternating round by round. Peak memory is the
summary's ``peak_memory_bytes``: on CPU the process's resident-set high-water mark since ``prepare`` (VmHWM), so
the Python and torch runtime (about 0.3 GB per process) is in both. With glibc's default, the resident set also
holds freed tensors' memory that malloc keeps for reuse (its mmap threshold rises to the largest freed block),
and FSDP frees a gathered unit and its gradient every layer: so each round also runs both variants with the
threshold fixed (``MALLOC_MMAP_THRESHOLD_``: a freed large tensor goes back to the system), where the resident
set follows the live tensors. ``memory_ratio`` comes from those runs, ``step_ratio`` from the default ones (fixing
the threshold costs page faults on every large allocation); ``memory_ratio_default_malloc`` is the first kind's.

``--job gpt`` runs ``examples/gpt.py`` instead (the run API, its own accumulation with ``run.no_sync()``, clipping,
fp32 here: ``--strategy.amp none``), at ``--gpt-layers`` x ``--gpt-width``, context 128, with and without
``--strategy.fsdp true``.

Run: python benchmarks/fsdp.py [--job mlp|gpt] [--rounds 3 --steps 16 --width 2048 --depth 4]
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

from _common import emit, launch_runs, spread

GPT = Path(__file__).resolve().parents[1] / "examples" / "gpt.py"

_THRESHOLD = "MALLOC_MMAP_THRESHOLD_"


def run_once(name: str, args: list[str], fixed_threshold: bool) -> dict:
    """One launched run's summary; with ``fixed_threshold`` glibc returns every freed large tensor at once."""
    if fixed_threshold:
        os.environ[_THRESHOLD] = str(128 * 1024)  # glibc's initial threshold, kept from rising
    try:
        s = launch_gpt(args) if args[:1] == ["gpt"] else launch_runs(2, [(name, args)])[name]
    finally:
        os.environ.pop(_THRESHOLD, None)
    f = s.get("fsdp") or {}
    peaks = ", ".join(f"{b / 2**20:.0f}" for b in s["peak_memory_bytes"])
    print(f"{name:5s} {'fixed ' if fixed_threshold else 'default'} malloc: step {s['step_time_s'] * 1e3:7.1f} ms  "
          f"peak/rank {peaks} MiB  optimizer state {s['optim_state_bytes'] / 2**20:.1f} MiB  bytes/step "
          f"{s['comm_bytes_per_step'] / 2**20:.1f} MiB" + (f" (all-gather {f['allgather_bytes_per_step'] / 2**20:.1f}, "
          f"reduce-scatter {f['reduce_scatter_bytes_per_step'] / 2**20:.1f})" if f else ""), flush=True)
    return s


def launch_gpt(args: list[str]) -> dict:
    """``examples/gpt.py`` on 2 launched processes (``args``: "gpt", then its arguments); its run summary."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "TRAINSCALE_JSON": f"{d}/s.json"}
        p = subprocess.run([sys.executable, "-m", "trainscale", "launch", "--nproc-per-node", "2", str(GPT), *args[1:]],
                           env=env, capture_output=True, text=True, timeout=1200)
        if p.returncode != 0:
            raise SystemExit(f"examples/gpt.py failed ({p.returncode}):\n{p.stderr[-3000:]}")
        return json.loads(Path(d, "s.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--job", choices=("mlp", "gpt"), default="mlp")
    ap.add_argument("--gpt-layers", type=int, default=4)
    ap.add_argument("--gpt-width", type=int, default=256)
    a = ap.parse_args()
    if a.job == "gpt":
        job = ["gpt", "--steps", str(a.steps), "--layers", str(a.gpt_layers), "--width", str(a.gpt_width), "--heads",
               "4", "--block", "128", "--sample", "0", "--eval-batches", "2", "--strategy.amp", "none",
               "--log.progress", "none", "--log.skip_first", "5"]
    else:
        job = ["--model.name", "mlp", "--model.width", str(a.width), "--model.depth", str(a.depth), "--data.name",
               "digits", "--data.eval_size", "0", "--data.batch_size", "32", "--optim.name", "adamw",
               "--optim.lr", "0.001", "--job.steps", str(a.steps), "--log.skip_first", "5"]
    variants = {"ddp": [], "fsdp": ["--strategy.fsdp", "true"]}
    step: dict[str, list[float]] = {k: [] for k in variants}
    peak: dict[str, list[float]] = {k: [] for k in variants}  # default malloc
    live: dict[str, list[float]] = {k: [] for k in variants}  # threshold fixed: the resident set follows live tensors
    measure = ""
    for r in range(a.rounds):
        print(f"round {r + 1}", flush=True)
        for name, extra in variants.items():
            live[name].append(max(run_once(name, [*job, *extra], True)["peak_memory_bytes"]))
            s = run_once(name, [*job, *extra], False)
            step[name].append(s["step_time_s"])
            peak[name].append(max(s["peak_memory_bytes"]))
            measure = s["peak_memory_measure"]
    ratios = [x / b for x, b in zip(step["fsdp"], step["ddp"])]
    mem = [x / b for x, b in zip(live["fsdp"], live["ddp"])]
    rss = [x / b for x, b in zip(peak["fsdp"], peak["ddp"])]
    emit({"step_ratio": statistics.median(ratios), "step_ratio_spread": spread(ratios),
          "memory_ratio": statistics.median(mem), "memory_ratio_spread": spread(mem),
          "memory_ratio_default_malloc": statistics.median(rss),
          "ddp_step_s": statistics.median(step["ddp"]), "fsdp_step_s": statistics.median(step["fsdp"]),
          "ddp_peak_bytes": statistics.median(live["ddp"]), "fsdp_peak_bytes": statistics.median(live["fsdp"]),
          "memory_measure": measure, "rounds": a.rounds, "steps": a.steps, "job": a.job,
          **({"gpt_layers": a.gpt_layers, "gpt_width": a.gpt_width} if a.job == "gpt" else
             {"width": a.width, "depth": a.depth})})


if __name__ == "__main__":
    main()
