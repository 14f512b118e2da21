"""``trainscale plan calibrate``: measure one job on this machine in one short session.

1. the job's gradient tensors (sizes in backward order), buffers and FLOPs, from the model itself;
2. its 1-process step (``trainscale train --nproc 1 --job.threads T``) at each thread count a rank will get;
3. per process count P: the backend's all-reduce at several sizes (alpha and beta fitted, residual kept, and
   its CPU seconds fitted the same way), the share of a core each of P busy ranks gets on this host now, and
   the step of the job's skeleton (its measured CPU spun, its buckets all-reduced as backward readies them),
   in one ``trainscale launch`` of ``trainscale.strategies.probe`` (there: it runs the strategies' own hooks);
   before it, at each rank's thread count, the data-parallel reducer's own time per step (``sim/reducer.py``:
   the job inside DDP on a process group of one minus the bare job), which the 1-process run (the bare module)
   does not have and every step at P > 1 does; the skeleton spins it too;
   across several nodes also the all-reduce that ``strategy.hierarchical`` runs (the DDP hook's node
   reduce-scatter, all-reduce across nodes and node all-gather) and the skeleton with it;
4. with ``interference``, before the probe: the job at 1 and at P ranks with the gradient exchange switched off
   (the doctor's ``ablate.comm``); the ratio of their CPU per step is how much the job's work inflates when P
   ranks share this host's caches and cores, and the skeleton spins that much more.

Example::

    trainscale plan calibrate --nproc 2,3,4 --out plan-cal.json --model resnet18 --data synthetic
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..about import available_cores
from ..config import ConfigError, config_to_dict
from ..jobs import LauncherOptions
from ..nodes import nodes as node_count
from .calibration import Calibration, fit_alpha_beta, job_key

__all__ = ["calibrate", "model_layout"]

SIZES = "4096,65536,1048576,4194304"


def model_layout(train_args: list[str]) -> dict[str, Any]:
    """Gradient tensor bytes in backward order, buffer bytes, parameters and FLOPs of one batch (fwd + bwd)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from ..data import build_datasets
    from ..jobs import check_train_args
    from ..models import build_model

    cfg = check_train_args(train_args)
    _, _, info = build_datasets(cfg.data)
    if info is None:  # a user's data set without its DataInfo: the shapes below would be guesses
        raise ConfigError("data.name", cfg.data.name, "a data set that returns its DataInfo (in_shape, num_classes) "
                          "to be calibrated")
    model = build_model(cfg.model.name, info.in_shape, info.num_classes, cfg.model.width, cfg.model.depth)
    params = [p for p in model.parameters() if p.requires_grad]
    # Backward produces gradients roughly in reverse registration order (DDP buckets them that way too).
    tensor_bytes = [float(p.numel() * p.element_size()) for p in reversed(params)]
    buffers = float(sum(b.numel() * b.element_size() for b in model.buffers()))
    x = torch.randn(cfg.data.batch_size, *info.in_shape)
    y = torch.randint(0, info.num_classes, (cfg.data.batch_size,))
    with FlopCounterMode(display=False) as fc:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    st = cfg.strategy
    return {"tensor_bytes": tensor_bytes, "buffer_bytes": buffers, "params": sum(p.numel() for p in params),
            "flops_per_step": float(fc.get_total_flops()), "job": job_key(config_to_dict(cfg)),
            # auto picks among candidates at run time; the skeleton takes DDP's default for it
            "bucket_mb": 25.0 if st.bucket_mb == "auto" else float(st.bucket_mb), "overlap": bool(st.overlap),
            "broadcast_buffers": bool(st.broadcast_buffers)}


def skeleton(layout: dict[str, Any], single: dict[str, float], inflation: float = 1.0,
             reducer_cpu_s: float = 0.0) -> dict[str, Any]:
    """The job's step as the probe replays it: one thread's CPU seconds and the buckets with their ready points.

    The 1-process run's CPU per step (all threads) is split evenly over its threads, and into forward + backward
    (``compute_s`` of ``step_s``) and the rest (optimizer, loop), which runs after the exchange. ``inflation``
    scales that CPU (the measured factor of :func:`_inflation`; 1: the 1-process CPU as it is).
    ``reducer_cpu_s``: the reducer's CPU seconds per step (``sim/reducer.py``), spun after the exchange, where
    DDP's work on the finished buckets ends the backward.
    """
    from ..costs.step import make_buckets, ready_at

    per_thread = single["cpu_s"] * inflation / max(1, int(single["threads"]))
    fb = min(1.0, single["compute_s"] / single["step_s"]) if single["step_s"] > 0 else 1.0
    buckets = make_buckets(layout["tensor_bytes"], layout["bucket_mb"] * 1024 * 1024)
    ready = ready_at(buckets, layout["tensor_bytes"], 1.0) if layout["overlap"] else [1.0] * len(buckets)
    reducer = reducer_cpu_s / max(1, int(single["threads"]))
    return {"cpu_s": per_thread * fb, "rest_cpu_s": per_thread * (1 - fb) + reducer, "backward_share": 2 / 3,
            "buckets": buckets, "ready": ready,
            "buffer_bytes": layout["buffer_bytes"] if layout["broadcast_buffers"] else 0.0}


def _probe(nproc: int, timeout: float, threads: int, sk: dict[str, Any] | None = None,
           launcher: LauncherOptions | None = None) -> dict[str, Any]:
    """One launch of the probe on ``nproc`` processes (through ``trainscale launch``, i.e. torchrun); with a
    multi-node ``launcher``, ``nproc`` on every node (the other nodes follow: ``trainscale.nodes``), and with
    2 or more per node the hierarchical all-reduce too."""
    from .. import jobs

    nodes = launcher.argv() if launcher and launcher.multi_node else []
    with tempfile.TemporaryDirectory(prefix="trainscale-probe-") as tmp:
        out = Path(tmp) / "probe.json"
        cmd = [sys.executable, "-m", "trainscale", "launch", "--nproc-per-node", str(nproc), *nodes, "-m",
               "trainscale.strategies.probe", "--out", str(out), "--sizes", SIZES, "--threads", str(threads)]
        if sk:
            cmd += ["--skeleton", json.dumps(sk, separators=(",", ":"))]
        if nodes and nproc > 1:
            cmd.append("--hierarchical")
        env = jobs.unplaced(os.environ)  # placed by the launcher options above, not by a scheduler's variables
        if nodes and jobs.on_launch is not None:
            jobs.on_launch(cmd, {}, f"all-reduce probe, {nproc} process(es) per node")
        try:
            rc, stdout, stderr = jobs.communicate_or_kill(cmd, env, timeout)  # its ranks too, whatever ends it
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"all-reduce probe on {nproc} processes gave no result within {timeout:g}s") from None
        if rc != 0 or not out.is_file():
            tail = " | ".join((stderr or stdout).strip().splitlines()[-3:])
            raise RuntimeError(f"all-reduce probe on {nproc} processes failed: {tail}")
        data = json.loads(out.read_text())
        data["command"] = "trainscale " + " ".join(shlex.quote(c) for c in cmd[3:])
        return data


def _single(train_args: list[str], threads: int, folder: Path, timeout: float) -> tuple[dict[str, float], str]:
    """The 1-process run at ``threads`` threads: its median step, compute, compute spread and CPU per step."""
    from ..jobs import RunSpec, run_train

    spec = RunSpec(1, [*train_args, "--job.threads", str(threads)], folder / f"single_t{threads}.json",
                   f"1 process, {threads} thread(s)")
    s = run_train(spec, timeout)
    compute = float(s["rank_compute_s"][0])
    spread = float((s.get("rank_compute_spread") or [0.0])[0] or 0.0)
    # The host's jitter: the wall step's noise beyond the compute's (each sigma = spread x median / 2.563).
    wall_sigma = float(s.get("step_time_spread") or 0.0) * float(s["step_time_s"]) / 2.563
    host_jitter = math.sqrt(max(0.0, wall_sigma ** 2 - (spread * compute / 2.563) ** 2))
    return {"step_s": float(s["step_time_s"]), "compute_s": compute, "spread": spread, "host_jitter_s": host_jitter,
            "samples_per_s": float(s["samples_per_s"]), "threads": threads,
            # CPU seconds against the mean wall of the same steps: the share of a core the run got.
            "cpu_s": float((s.get("rank_cpu_s") or [0.0])[0] or 0.0),
            "mean_step_s": float(s["global_batch"]) / float(s["samples_per_s"])}, spec.shell()


def _nocomm_cpu(train_args: list[str], nproc: int, threads: int, folder: Path,
                timeout: float) -> tuple[list[float], str]:
    """CPU seconds per step of each rank of the job on ``nproc`` ranks at ``threads`` threads, with no exchange."""
    from ..jobs import RunSpec, run_train

    spec = RunSpec(nproc, [*train_args, "--job.threads", str(threads), "--ablate.comm", "true"],
                   folder / f"nocomm_p{nproc}_t{threads}.json", f"{nproc} process(es), no exchange")
    s = run_train(spec, timeout)
    return [float(c) for c in (s.get("rank_cpu_s") or []) if c], spec.shell()


def _inflation(at_p: list[float], at_1: list[float]) -> dict[str, Any]:
    """How much more CPU per step a rank needs beside P-1 others than alone, the exchange off in both.

    Both runs load, compute and step as the job does; only the ranks sharing the host differ (with DDP's own
    work left in the 1-process run, mlp on digits measured 0.5-0.9x: the wrapper's share, not the host's).
    Sharing the host does not make work cheaper: a ratio under 1 is the noise of two short runs (mlp on digits,
    2 ms steps: 0.74-1.0 in one benchmark), so ``factor`` is at least 1 and ``ratio`` keeps what was measured.
    """
    mean, one = sum(at_p) / len(at_p) if at_p else 0.0, at_1[0] if at_1 else 0.0
    ratio = mean / one if mean > 0 and one > 0 else 1.0
    return {"cpu_s": mean, "rank_cpu_s": at_p, "single_cpu_s": one, "ratio": ratio, "factor": max(1.0, ratio)}


def _fitted(d: dict[str, Any]) -> dict[str, Any]:
    """A probe's all-reduce times and CPU seconds per size as alpha-beta fits, with their points."""
    ab, resid = fit_alpha_beta([tuple(x) for x in d["allreduce"]])
    cpu, _ = fit_alpha_beta([tuple(x) for x in d["allreduce_cpu"]])
    return {"alpha": ab.alpha, "beta": ab.beta, "residual": resid, "points": d["allreduce"],
            "threads": d.get("threads"), "cpu_alpha": cpu.alpha, "cpu_beta": cpu.beta,
            "cpu_points": d["allreduce_cpu"], "queued_points": d["allreduce_queued"]}


def _replayed(step: dict[str, Any], layout: dict[str, Any], sk: dict[str, Any], threads: int) -> dict[str, Any]:
    """A skeleton's measured step with what it replayed (the calibration's ``replay`` entry).

    ``exchange_cpu_s``: a rank's CPU seconds per step beyond what it spun (its threads each spin ``spin_cpu_s``):
    Gloo's work on the buckets as the job's step paces them, with the threads' waking and waiting for a peer,
    which a burst of all-reduces (the probe's per-call CPU fit) keeps awake and so does not pay.
    """
    spin = sk["cpu_s"] + sk["rest_cpu_s"]
    cpus = [float(c) for c in step.get("rank_cpu_s") or []]
    paced = max(0.0, sum(cpus) / len(cpus) - spin * threads) if cpus else None
    return {**step, "bucket_mb": layout["bucket_mb"], "overlap": layout["overlap"], "buckets": len(sk["buckets"]),
            "threads": threads, "spin_cpu_s": spin, "exchange_cpu_s": paced}


def _said(say: Callable[[str], None], f: dict[str, Any], rest: str, what: str = "") -> None:
    beta = f["beta"]
    say(f"  {what}alpha {f['alpha'] * 1e6:.0f} us, beta {beta * 1e9:.3f} ns/B "
        f"({1 / beta / 1e9 if beta else float('inf'):.2f} GB/s), residual {f['residual']:.0%}, "
        f"CPU {f['cpu_alpha'] * 1e6:.0f} us + {f['cpu_beta'] * 1e9:.3f} ns/B per call{rest}")


def _ones(train_args: list[str], nprocs: list[int], thread_counts: list[int], n_cores: int, timeout: float,
          say: Callable[[str], None], interference: bool, commands: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the 1-process run per thread count, the inflation at each P where ``interference``)."""
    single, inflation = {}, {}
    with tempfile.TemporaryDirectory(prefix="trainscale-cal-") as tmp:
        for t in thread_counts:
            say(f"calibrate: 1 process, {t} thread(s)")
            single[str(t)], cmd = _single(train_args, t, Path(tmp), timeout)
            commands.append(cmd)
        alone: dict[int, list[float]] = {}  # threads -> the 1-process run's CPU per step, no exchange
        for p in (n for n in nprocs if n > 1 and interference):
            t = max(1, n_cores // p)
            if t not in alone:
                say(f"calibrate: 1 process, {t} thread(s), no gradient exchange")
                alone[t], cmd = _nocomm_cpu(train_args, 1, t, Path(tmp), timeout)
                commands.append(cmd)
            say(f"calibrate: the job on {p} processes, no gradient exchange")
            at_p, cmd = _nocomm_cpu(train_args, p, t, Path(tmp), timeout)
            commands.append(cmd)
            inflation[str(p)] = _inflation(at_p, alone[t])
            say(f"  CPU per step {inflation[str(p)]['cpu_s'] * 1e3:.2f} ms, x{inflation[str(p)]['ratio']:.3f} "
                "the 1-process run's")
    return single, inflation


def _reducers(train_args: list[str], thread_counts: list[int], timeout: float, say: Callable[[str], None],
              commands: list[str]) -> dict[str, dict[str, Any]]:
    """Threads -> the reducer's own wall and CPU seconds per step at that thread count (``sim/reducer.py``)."""
    from .reducer import command, measure

    out = {}
    for t in thread_counts:
        say(f"calibrate: the data-parallel reducer's own time, 1 process, {t} thread(s)")
        out[str(t)] = r = measure(train_args, t, timeout)
        commands.append(command(train_args, t))
        say(f"  {r['s'] * 1e3:.2f} ms per step (CPU {r['cpu_s'] * 1e3:.2f} ms): the step inside DDP "
            f"{r['ddp_step_s'] * 1e3:.2f} ms, bare {r['bare_step_s'] * 1e3:.2f} ms")
    return out


def _probes(layout: dict[str, Any], single: dict[str, Any], inflation: dict[str, Any], reducer: dict[str, Any],
            nprocs: list[int], n_cores: int, timeout: float, say: Callable[[str], None],
            launcher: LauncherOptions | None, nn: int, commands: list[str]) -> dict[str, dict[str, Any]]:
    """The all-reduce, core share and skeleton at each P (and across nodes, flat and hierarchical, with a launcher)."""
    got: dict[str, dict[str, Any]] = {k: {} for k in ("allreduce", "across", "share", "replay", "across_hier",
                                                       "replay_hier")}
    for p in (n for n in nprocs if n > 1):
        t = max(1, n_cores // p)
        sk = skeleton(layout, single[str(t)], inflation.get(str(p), {}).get("factor", 1.0),
                      float(reducer.get(str(t), {}).get("cpu_s", 0.0)))
        for world, opts in ((p, None), (p * nn, launcher)) if nn > 1 else ((p, None),):
            say(f"calibrate: all-reduce, CPU share and the job's skeleton on {p} processes"
                + (f" on each of {nn} nodes, flat and hierarchical" if opts else ""))
            d = _probe(p, timeout, t, sk, opts)
            got["across" if opts else "allreduce"][str(p)] = f = _fitted(d)
            if not opts:
                got["share"][str(p)] = float(d["share"])
            got["replay"][str(world)] = _replayed(d["skeleton"], layout, sk, t)
            commands.append(d["command"])
            _said(say, f, f", core share {float(d['share']):.2f}, skeleton step "
                          f"{got['replay'][str(world)]['step_s'] * 1e3:.1f} ms", "flat: " if opts else "")
            if opts and "hierarchical" in d:
                h = d["hierarchical"]
                got["across_hier"][str(p)] = f = _fitted(h)
                got["replay_hier"][str(world)] = _replayed(h["skeleton"], layout, sk, t)
                _said(say, f, f", skeleton step {got['replay_hier'][str(world)]['step_s'] * 1e3:.1f} ms",
                      "hierarchical (node reduce-scatter, all-reduce across, node all-gather): ")
    if nn > 1:
        say(f"calibrate: the link between nodes, 1 process on each of {nn} nodes")
        d = _probe(1, timeout, n_cores, None, launcher)
        got["across"]["1"] = f = _fitted(d)
        commands.append(d["command"])
        _said(say, f, "")
    return got


def calibrate(train_args: list[str], nprocs: list[int], out: Path, timeout: float = 600.0,
              say: Callable[[str], None] = print, with_base: bool = True, interference: bool = False,
              launcher: LauncherOptions | None = None) -> Calibration:
    """Measure the job and this machine; write and return the calibration (nothing written on failure).

    ``with_base=False`` skips the 1-process run at all cores (needed for speed-up, not for step times);
    ``interference=True`` also measures the job at 1 and at P ranks without the exchange (:func:`_inflation`);
    a multi-node ``launcher``: the all-reduce and the skeleton also at P processes on every node, flat and
    hierarchical, and the link between nodes alone (1 process on each); the 1-process runs stay on this node.
    """
    from ..jobs import check_train_args

    check_train_args(train_args)
    if not any(a in ("--steps", "--job.steps") or a.startswith(("--steps=", "--job.steps=")) for a in train_args):
        train_args = [*train_args, "--steps", "40"]  # a short session: enough measured steps for a median
    n_cores = available_cores()
    say("calibrate: model layout and FLOPs")
    layout = model_layout(train_args)
    thread_counts = sorted(({n_cores} if with_base else set()) | {max(1, n_cores // p) for p in nprocs})
    commands: list[str] = []
    single, inflation = _ones(train_args, nprocs, thread_counts, n_cores, timeout, say, interference, commands)
    multi = launcher is not None and launcher.multi_node
    nn = node_count(launcher) if launcher is not None and multi else 1
    reducer = _reducers(train_args, sorted({max(1, n_cores // p) for p in nprocs if p > 1}), timeout, say, commands)
    got = _probes(layout, single, inflation, reducer, nprocs, n_cores, timeout, say, launcher, nn, commands)
    cal = Calibration(layout["job"], list(train_args), layout["params"], layout["tensor_bytes"], layout["buffer_bytes"],
                      layout["flops_per_step"], n_cores, single, got["allreduce"], got["share"],
                      machine=f"{platform.node()}, {n_cores} cores" + (f" per node, {nn} nodes" if multi else ""),
                      commands=commands, replay=got["replay"], inflation=inflation, nnodes=nn, across=got["across"],
                      across_hier=got["across_hier"], replay_hier=got["replay_hier"], reducer=reducer)
    cal.save(out)
    return cal
