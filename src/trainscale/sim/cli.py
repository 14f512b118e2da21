"""``trainscale plan``: forecast speed-up and scaling efficiency before paying for a cluster.

Example::

    trainscale plan calibrate --nproc 2,4 --out plan-cal.json --model resnet18 --data synthetic
    trainscale plan --calibration plan-cal.json --nproc 1,2,4
    trainscale plan --model vgg16 --samples-per-s-1 154 --batch-size 64 --gpu P100 --gpus-per-node 4 \\
        --nodes 1,2,32,128 --intra pcie3 --inter 25gbe
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from ..config import ConfigError
from ..config_io import int_list
from ..nodes import add_node_options, follow, launcher_options, leading

__all__ = ["main"]

# Per world size, the strategies ranked by forecast samples/s: (label, samples/s, efficiency).
Compared = list[tuple[int, list[tuple[str, float, float]]]]

EPILOG = """sources of the 1-device step (one of):
  --calibration FILE        measured here by `trainscale plan calibrate` (FLOPs of the job kept for other GPUs)
  --samples-per-s-1 X       a throughput measured elsewhere, with --batch-size (and --params or --model)
  train options             calibrate now (as `trainscale plan calibrate` would), then forecast

examples:
  trainscale plan calibrate --nproc 2,3,4 --out cal.json --model mlp --data digits
  trainscale plan --calibration cal.json --nproc 1,2,3,4                  # this machine
  trainscale plan --calibration cal.json --gpu V100 --gpus-per-node 8 --nodes 1,2,4 --intra nvlink2 --inter 100gbe
  trainscale plan --model se_resnext152 --samples-per-s-1 23.33 --batch-size 40 --gpu P40 \\
      --gpus-per-node 8 --world-size 1,4,8 --topo topo.txt --measured 4:3.15,8:4.79
  trainscale plan --model vgg16 --samples-per-s-1 154 --batch-size 64 --gpu P100 --gpus-per-node 4 \\
      --nodes 1,128 --intra pcie3 --inter 25gbe --bucket-mb 64 --compare
  trainscale plan --params 25.6e6 --inter 50gbe --gpus-per-node 8 --intra nvlink1 --gpu P100 \\
      --samples-per-s-1 230 --batch-size 32 --nodes 1,32                 # Goyal et al. 2017's cluster
  trainscale plan --params 8.03B --gpu name=H200,bf16=989T,mem=4.8TB/s --precision bf16 --samples-per-s-1 1.3 \\
      --batch-size 2 --intra nvlink4 --inter 3200Gb/s --fsdp-units 32 --compression bf16 --framework-overhead fitted
"""


INTERFERENCE_HELP = ("also run the job at 1 and at each P process(es) with the gradient exchange off "
                     "(ablate.comm) and scale what the skeleton spins by the ratio of their CPU per step: how much "
                     "the job's work inflates when P ranks share this host's caches and cores, which a 1-process "
                     "calibration cannot see; a ratio under 1 is taken as 1 (two more short runs per P)")


def _parser() -> argparse.ArgumentParser:
    """The options of ``trainscale plan``."""
    p = argparse.ArgumentParser(prog="trainscale plan", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Forecast step time, speed-up and scaling efficiency of a data-parallel job "
                                            "on a cluster, from one device's step and the cluster's links.",
                                epilog=EPILOG)
    a = p.add_argument
    a("--calibration", metavar="FILE", help="calibration JSON written by `trainscale plan calibrate`")
    a("--gpu", help="target GPU from the catalogue (P40, P100, V100, A100, H100, H200), or one given by its datasheet as "
                    "key=value pairs: name=H200,bf16=989T,fp8=1979T,mem=4.8TB/s (a peak per precision or flops=, and "
                    "mem=); none: this calibrated machine")
    a("--gpus-per-node", default="8", help="devices per node (default 8)")
    a("--nodes", default="1,2,4,8", help="node counts to forecast, comma-separated (default 1,2,4,8)")
    a("--world-size", help="device counts instead of --nodes: each at most --gpus-per-node or a multiple of it")
    a("--nproc", default="1,2,4", help="processes on this machine, for a forecast of the calibrated machine itself")
    a("--interference", action="store_true", help="with train options: " + INTERFERENCE_HELP)
    a("--intra", default="pcie3", help="link between devices of a node (pcie3/4/5, nvlink1-4; default pcie3), or its "
                                       "rate per direction, e.g. 64GB/s (5.7 us per hop unless given: 64GB/s@3us)")
    a("--inter", default="25gbe", help="link between nodes (10/25/100/200/400gbe, ib-edr/hdr/ndr; default 25gbe), or "
                                       "the node's rate: 50gbe, 50gbps, 3200Gb/s, 12.5GB/s (b: bits, B: bytes; 14 us per "
                                       "hop unless given: 50gbps@20us)")
    a("--nics-per-node", default="1", help="with --gpu: network adapters per node; NCCL spreads its rings over min(GPUs, NICs) "
                                           "of them, each at --inter's rate (DGX A100: 8, DGX-2: 8; default 1)")
    a("--topo", metavar="FILE", help="`nvidia-smi topo -m` output of one node: the ring's slowest hop sets --intra")
    a("--samples-per-s-1", help="measured one-device throughput (instead of the FLOP estimate), e.g. 230 or 1.2k")
    a("--params", help="parameters of a model not in the registry or catalogue: 25600000, 25_600_000, 25.6e6 or 25.6M")
    a("--batch-size", help="samples per device per step")
    a("--model", help="catalogue model (inception_v3, resnet101, vgg16, se_resnext152) for --params, or a train model")
    a("--precision", default="fp32", help="peak used by the FLOP estimate (fp32, tf32, fp16, bf16)")
    a("--mfu", type=float, default=0.4, help="share of peak FLOP/s the job reaches (FLOP estimate only; default 0.4)")
    a("--framework-overhead", default="0", metavar="KAPPA",
      help="with --gpu: add KAPPA x the 1-device step to every step at more than one device, what frameworks lose "
           "beyond communication; 'fitted': the catalogue's measurable terms instead (step spread, host jitter, "
           "DDP's time per parameter; costs/catalog.json scale_terms, scored leave-one-source-out in docs/plan.md); "
           "default 0")
    a("--host-sync", action="store_true", help="the step waits for the host every step (a loss scaler's overflow "
                                               "check, loss.item()): the host's jitter adds to the slowest rank")
    a("--measured", help="measured speed-ups W:S,... (e.g. 4:3.15,8:4.79) or a bench.json: says whether the "
                         "forecast explains them")
    a("--json", metavar="PATH", help="write the forecast as JSON ({points: [...], assumptions: {...}})")
    a("--out", default="runs/plan", help="folder for plan.json, plan.md, plan.html and plots (default runs/plan)")
    a("--compare", action="store_true", help="rank strategies per world size and say which to use")
    _strategy_options(p)
    return p


def _strategy_options(p: argparse.ArgumentParser) -> None:
    """The ``strategy`` options of ``trainscale plan``."""
    g = p.add_argument_group("strategy")
    g.add_argument("--bucket-mb", type=float, default=25.0, help="fusion bucket in MB; 0: one all-reduce per tensor")
    g.add_argument("--no-overlap", action="store_true", help="all-reduce after backward instead of during it")
    g.add_argument("--hierarchical", action="store_true", help="intra reduce-scatter, inter all-reduce, intra all-gather")
    g.add_argument("--algo", default="ring", choices=("ring", "tree"), help="flat all-reduce algorithm")
    g.add_argument("--compression", default="none", choices=("none", "fp16", "bf16", "powersgd"))
    g.add_argument("--local-sgd", type=int, default=0, metavar="H", help="average parameters every H steps")
    g.add_argument("--zero1", action="store_true", help="shard the optimizer state (ZeRO-1)")
    g.add_argument("--ps-mode", default="", help="parameter server: sync, k-sync, k-batch-sync, async, k-async, "
                                                  "k-batch-async")
    g.add_argument("--ps-k", type=int, default=0, help="K of the k-* modes (default P // 2)")
    g.add_argument("--pipeline-stages", type=int, default=1)
    g.add_argument("--microbatches", type=int, default=8)
    g.add_argument("--schedule", default="1f1b", help="gpipe, 1f1b or interleaved:V")
    g.add_argument("--fsdp-units", type=int, default=0, metavar="N",
                   help="forecast FSDP (strategy.fsdp) with N equal units, e.g. the model's blocks, instead of DDP: "
                        "each unit all-gathered before its forward and backward and reduce-scattered after it, "
                        "one unit of prefetch (--no-overlap: none); --compression fp16/bf16 sets both collectives' dtype")
    g.add_argument("--fsdp-gather-dtype", metavar="DTYPE",
                   help="FSDP: dtype parameters are all-gathered in: fp32 (default), bf16, fp16 or fp8 (param_dtype)")
    g.add_argument("--fsdp-reduce-dtype", metavar="DTYPE",
                   help="FSDP: dtype gradients are reduce-scattered in: fp32 (default), bf16 or fp16 (reduce_dtype)")


def _numbers(a: argparse.Namespace) -> None:
    """Counts and rates as users write them (``25.6e6``, ``25_600_000``, ``25.6M``), checked before anything runs."""
    from ..costs.units import parse_count, parse_number

    a.gpus_per_node = parse_count(a.gpus_per_node, "--gpus-per-node")
    a.nics_per_node = parse_count(a.nics_per_node, "--nics-per-node")
    if a.params is not None:
        a.params = parse_count(a.params, "--params")
    if a.batch_size is not None:
        a.batch_size = parse_count(a.batch_size, "--batch-size")
    if a.samples_per_s_1 is not None:
        a.samples_per_s_1 = parse_number(a.samples_per_s_1, "--samples-per-s-1")
    if a.framework_overhead != "fitted":
        a.framework_overhead = parse_number(a.framework_overhead, "--framework-overhead",
                                            "a share of the 1-device step >= 0 (e.g. 0.05), or fitted")
        if a.framework_overhead < 0:
            raise ConfigError("--framework-overhead", a.framework_overhead, "must be >= 0, or fitted")


def _strategy(a: argparse.Namespace) -> Any:
    """The strategy to forecast, from the ``strategy`` options."""
    from ..costs.forecast import StrategySpec

    if a.bucket_mb < 0:
        raise ConfigError("--bucket-mb", a.bucket_mb, "must be >= 0 (0: one all-reduce per tensor)")
    if a.fsdp_units < 0:
        raise ConfigError("--fsdp-units", a.fsdp_units, "must be >= 1 (the units FSDP shards), or 0 for DDP")
    gather, reduce = 4.0, 4.0
    if a.fsdp_units:
        others = {"--hierarchical": a.hierarchical, "--compression powersgd": a.compression == "powersgd",
                  "--local-sgd": a.local_sgd, "--zero1": a.zero1, "--ps-mode": a.ps_mode,
                  "--pipeline-stages": a.pipeline_stages > 1, "--compare": a.compare}
        clash = [k for k, on in others.items() if on]
        if clash:
            raise ConfigError("--fsdp-units", a.fsdp_units, f"FSDP is forecast on its own, not with {', '.join(clash)}")
        # --compression fp16/bf16 is FSDP's mixed precision: both collectives in that dtype unless given apart
        both = a.compression if a.compression in FSDP_DTYPES else "fp32"
        gather = _fsdp_dtype(a.fsdp_gather_dtype or both, "--fsdp-gather-dtype")
        reduce = _fsdp_dtype(a.fsdp_reduce_dtype or both, "--fsdp-reduce-dtype")
    elif a.fsdp_gather_dtype or a.fsdp_reduce_dtype:
        raise ConfigError("--fsdp-gather-dtype" if a.fsdp_gather_dtype else "--fsdp-reduce-dtype",
                          a.fsdp_gather_dtype or a.fsdp_reduce_dtype, "needs --fsdp-units N (FSDP)")
    compression = "none" if a.fsdp_units else a.compression
    return StrategySpec(a.bucket_mb, not a.no_overlap, a.hierarchical, a.algo, compression, 1, a.local_sgd, a.zero1,
                        a.ps_mode, a.ps_k, 0.0, a.pipeline_stages, a.microbatches, a.schedule, a.fsdp_units,
                        gather, reduce)


# Bytes per element of FSDP's collectives (its MixedPrecisionPolicy param_dtype and reduce_dtype; fp8 all-gather
# as torchao's float8 training sends it).
FSDP_DTYPES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


def _fsdp_dtype(text: str, key: str) -> float:
    """Bytes per element of an FSDP collective's dtype, or a one-line error naming the accepted ones."""
    if text not in FSDP_DTYPES:
        raise ConfigError(key, text, "one of " + ", ".join(FSDP_DTYPES))
    return FSDP_DTYPES[text]


def _worlds(a: argparse.Namespace) -> list[int]:
    """Device counts to forecast on a catalogue cluster: ``--world-size``, else ``--nodes`` x ``--gpus-per-node``."""
    if a.gpus_per_node < 1:
        raise ConfigError("--gpus-per-node", a.gpus_per_node, "must be >= 1")
    if a.world_size:
        worlds = int_list(a.world_size, "--world-size")
        for w in worlds:
            if w > a.gpus_per_node and w % a.gpus_per_node:
                raise ConfigError("--world-size", w, f"does not divide into nodes of {a.gpus_per_node} devices; give at "
                                  f"most {a.gpus_per_node} or a multiple of --gpus-per-node")
        return worlds
    return [a.gpus_per_node * n for n in int_list(a.nodes, "--nodes")]


def _measured(text: str | None) -> dict[int, float]:
    """Measured speed-ups by world size, from ``W:S,...`` pairs or a bench.json."""
    if not text:
        return {}
    if Path(text).is_file():
        import json

        try:
            pts = json.loads(Path(text).read_text())["points"]
            return {int(p["world_size"]): float(p["speedup"]) for p in pts}
        except (ValueError, KeyError, TypeError):
            raise ConfigError("--measured", text, "not a bench.json with points (world_size, speedup)") from None
    try:
        return {int(w): float(s) for w, s in (x.split(":") for x in text.split(",") if x.strip())}
    except ValueError:
        raise ConfigError("--measured", text, "W:SPEEDUP pairs, e.g. 4:3.15,8:4.79, or a bench.json") from None


def _job_from_args(a: argparse.Namespace, cal: Any, assumptions: dict[str, Any]) -> Any:
    """The 1-device job on the target GPU: measured throughput, or FLOPs / (peak x mfu)."""
    from ..costs.forecast import Job
    from ..costs.hardware import gpu, known_model
    from ..costs.step import profile_tensors

    entry = known_model(a.model) if a.model else None
    if a.model and entry is None and cal is None and a.params is None:
        from ..costs.hardware import catalog

        raise ConfigError("--model", a.model, "not in the catalogue; one of " + ", ".join(catalog()["models"]) +
                          ", or give --params N (or a --calibration of it)")
    params = a.params or (entry["params"] if entry else (cal.params if cal else None))
    if params is None:
        raise ConfigError("--params", None, "needed: give --params N, a catalogue --model, or --calibration FILE")
    batch = a.batch_size or (int(cal.job.get("data.batch_size")) if cal else None)
    if not batch:
        raise ConfigError("--batch-size", None, "needed with --samples-per-s-1 or --params (samples per device)")
    if a.samples_per_s_1:
        if a.samples_per_s_1 <= 0:
            raise ConfigError("--samples-per-s-1", a.samples_per_s_1, "must be a throughput > 0 (samples/s)")
        step = batch / a.samples_per_s_1
        assumptions["one_device_step_s"] = f"{step:.4f} = batch {batch} / {a.samples_per_s_1} samples/s (given)"
    elif cal is not None:
        g = gpu(a.gpu)
        flops = cal.flops_per_step * batch / max(1, int(cal.job.get("data.batch_size") or batch))
        step = flops / (g.peak(a.precision) * a.mfu)
        assumptions["one_device_step_s"] = (f"{step:.5f} = {flops:.3g} FLOPs (counted) / ({g.name} {a.precision} peak "
                                            f"{g.peak(a.precision) / 1e12:g} TFLOP/s x mfu {a.mfu})")
    else:
        raise ConfigError("--samples-per-s-1", None, "needed without --calibration (a measured one-device throughput)")
    if cal is not None and not a.params:
        tb, costs = [b * 1.0 for b in cal.tensor_bytes], None
    else:
        tail = (entry or {}).get("tail_params", 0.0), (entry or {}).get("tail_compute", 0.0)
        tb, costs = profile_tensors(params * 4.0, *tail)
    assumptions["params"] = f"{params:,}" + (f" ({entry['source']})" if entry and not a.params else "")
    return Job(a.model or (cal.job.get("model.name") if cal else "job"), params, batch, step, step, tensor_bytes=tb,
               tensor_costs=costs, buffer_bytes=cal.buffer_bytes if cal else 0.0)


def _compare(job: Any, cluster: Any, base: Any, worlds: list[int]) -> Compared:
    """Rank strategies per world size by samples/s."""
    from ..costs.forecast import forecast

    cands = [replace(base, bucket_mb=b) for b in (0, 1, 4, 25, 64)]
    cands += [replace(base, hierarchical=True), replace(base, compression="fp16"), replace(base, compression="bf16"),
              replace(base, compression="powersgd"), replace(base, local_sgd_period=4),
              replace(base, local_sgd_period=16), replace(base, zero1=True),
              replace(base, ps_mode="sync"), replace(base, ps_mode="k-sync"), replace(base, ps_mode="async")]
    out = []
    for w in worlds:
        ranked = []
        for s in cands:
            try:
                p = forecast(job, cluster, s, [w])[0]
            except ConfigError:
                continue
            ranked.append((s.label(), p.samples_per_s, p.efficiency))
        ranked.sort(key=lambda r: -r[1])
        out.append((w, ranked))
    return out


def _calibrate_main(argv: list[str]) -> int:
    """Entry of ``trainscale plan calibrate``: measure the job on this machine and write the calibration file."""
    from .calibrate import calibrate

    p = argparse.ArgumentParser(prog="trainscale plan calibrate", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Measure the job on this machine in one short session: its 1-process step "
                                            "at each thread count a rank will get, and per process count the "
                                            "backend's all-reduce (alpha, beta, residual), the compute slow-down of "
                                            "ranks sharing the cores, and a skeleton of the job's step (its measured "
                                            "CPU, its buckets all-reduced as backward readies them) that anchors the "
                                            "forecast of this machine. Other options go to `trainscale train`.",
                                epilog="example:\n  trainscale plan calibrate --nproc 2,3,4 --out cal.json --model mlp\n"
                                       "on two nodes (the same line on each, with its --node-rank; then\n"
                                       "`trainscale plan --calibration cal.json --nproc 4` forecasts 2 x 2):\n"
                                       "  trainscale plan calibrate --nproc 2 --nnodes 2 --node-rank 0 "
                                       "--master-addr node0 --out cal.json")
    p.add_argument("--nproc", default="2,4", help="process counts to measure all-reduce at (default 2,4)")
    p.add_argument("--out", default="plan-calibration.json", help="calibration file to write")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one measurement may take")
    p.add_argument("--interference", action="store_true", help=INTERFERENCE_HELP)
    add_node_options(p)
    a, rest = p.parse_known_args(argv)
    nprocs = int_list(a.nproc, "--nproc")
    launcher = launcher_options(a)
    if Path(a.out).is_dir():
        raise ConfigError("--out", a.out, "is a folder; give a file path for the calibration JSON")
    if launcher.node_rank > 0:  # node 0 measures and writes the file; this node takes part in its probes
        return follow(launcher, a.timeout)
    try:
        with leading(launcher):
            cal = calibrate(rest, nprocs, Path(a.out), a.timeout,
                            say=lambda m: print(m, file=sys.stderr, flush=True), interference=a.interference,
                            launcher=launcher)
    except RuntimeError as e:
        print(f"trainscale plan calibrate: {e}", file=sys.stderr)
        return 1
    s = cal.single
    print(f"wrote {a.out}: {cal.params:,} parameters, 1-process step " +
          ", ".join(f"{v['step_s'] * 1e3:.2f} ms at {t} thread(s)" for t, v in s.items()))
    return 0


def main(argv: list[str]) -> int:
    """Entry of ``trainscale plan``: check the options, find the job and cluster, forecast, write and print."""
    if argv and argv[0] == "calibrate":
        return _calibrate_main(argv[1:])
    from ..reporting import write_json
    from .report import plan_json, print_plan, write_plan

    a, rest = _parser().parse_known_args(argv)
    _numbers(a)
    strategy = _strategy(a)
    measured = _measured(a.measured)
    cal = _calibration(a, rest)
    assumptions: dict[str, Any] = {"strategy": strategy.label()}
    target = _catalog_target(a, cal, assumptions) if a.gpu else _machine_target(a, cal, assumptions)
    points, notes, compare = _forecast(a, target, strategy, measured, assumptions, cal)
    doc = plan_json(points, assumptions, {"measured_speedup": measured, "conclusions": notes,
                                          "compare": compare or []})
    files = write_plan(Path(a.out), doc, points, notes, compare)
    if a.json:
        write_json(Path(a.json), doc)
    title = target.title + (f", {strategy.label()}" if strategy.fsdp_units else "")
    print_plan(points, title, notes, [*files, *([a.json] if a.json else [])])
    return 0


class _Target(NamedTuple):
    """What is forecast: the 1-device job, the cluster it runs on, the world sizes, the report's title."""

    job: Any
    cluster: Any
    worlds: list[int]
    title: str


def _calibration(a: argparse.Namespace, rest: list[str]) -> Any:
    """The job measured on this machine: ``--calibration`` checked against the options, or calibrated now."""
    from .calibration import Calibration

    if a.calibration:
        cal = Calibration.load(a.calibration)
        if rest:
            from ..config import config_to_dict
            from ..jobs import check_train_args
            from .calibration import job_key

            cal.check_job(job_key(config_to_dict(check_train_args(rest))), a.calibration)
        from ..costs.hardware import known_model

        if a.model and known_model(a.model) is None:  # --model names a train model: it must be the calibrated one
            cal.check_job({"model.name": a.model}, a.calibration)
        if a.batch_size and not a.gpu:  # this machine's step was measured at the calibrated batch only
            cal.check_job({"data.batch_size": a.batch_size}, a.calibration)
        return cal
    if rest:
        from .calibrate import calibrate

        return calibrate(rest, [n for n in int_list(a.nproc, "--nproc") if n > 1] or [2], Path(a.out) / "calibration.json",
                         say=lambda m: print(m, file=sys.stderr, flush=True), interference=a.interference)
    return None


def _catalog_target(a: argparse.Namespace, cal: Any, assumptions: dict[str, Any]) -> _Target:
    """A cluster of ``--gpu`` from the catalogue (links, topology) and the job's step on that GPU."""
    from ..costs.forecast import ClusterSpec
    from ..costs.hardware import gpu
    from ..costs.topology import parse_topo

    gpu(a.gpu)  # an unknown GPU fails before anything is computed
    topo = None
    if a.topo:
        if not Path(a.topo).is_file():
            raise ConfigError("--topo", a.topo, "no such file (save `nvidia-smi topo -m` output to it)")
        topo = parse_topo(Path(a.topo).read_text(), a.topo)
    cluster = ClusterSpec.from_catalog(a.gpu, a.gpus_per_node, a.intra, a.inter, topo)
    cluster.nics_per_node = a.nics_per_node
    worlds = _worlds(a)
    job = _job_from_args(a, cal, assumptions)
    intra, inter = cluster.intra, cluster.inter
    assert intra is not None and inter is not None  # from_catalog sets both links
    assumptions.update({"gpu": a.gpu, "gpus_per_node": a.gpus_per_node, "intra": f"{intra.name} "
                        f"{intra.gbs:g} GB/s, {intra.hw_lat_us} us/hop",
                        "inter": f"{inter.name} {inter.gbs:g} GB/s x {cluster.net_efficiency} "
                        f"efficiency, {inter.hw_lat_us} us/hop, {cluster.nics_per_node} NIC(s) per node",
                        "backward_share": f"{job.backward_share:.2f} of compute (backward ~ 2x forward)",
                        "batch_size": job.batch_size})
    if topo is not None:
        assumptions["topology"] = (f"ring's slowest hop {topo.ring_bottleneck()}, groups {topo.groups()}, "
                                   f"NIC reached through {topo.nic_class()}")
    return _Target(job, cluster, worlds, f"trainscale plan: {job.name} on {a.gpu} x {a.gpus_per_node} per node")


def _machine_target(a: argparse.Namespace, cal: Any, assumptions: dict[str, Any]) -> _Target:
    """This calibrated machine at ``--nproc`` processes: its measured all-reduce, sharing and skeleton steps."""
    if cal is None:
        raise ConfigError("--gpu", None, "give a target --gpu (with --samples-per-s-1 or --calibration), or "
                          "--calibration FILE / train options to forecast this machine")
    worlds = int_list(a.nproc, "--nproc")
    cluster = cal.cluster(max(worlds))
    missing = [w for w in worlds if w > 1 and str(w) not in cal.allreduce]
    job = cal.base_job(cal.cores)
    assumptions.update({"machine": cal.machine, "calibrated_nproc": sorted(int(p) for p in cal.allreduce),
                        "extrapolated_nproc": missing, "core_share": cal.share,
                        "outside_threads": round(cluster.outside, 2),
                        # the forecast at these P is anchored on the job's skeleton measured there
                        "skeleton_step_s": {p: round(v["step_s"], 5) for p, v in cal.replay.items()},
                        # measured with --interference: the job's CPU per step on P ranks over 1 process
                        "compute_inflation": {p: round(v["factor"], 4) for p, v in cal.inflation.items()},
                        # threads -> DDP's reducer at P > 1 (absent from the bare 1-process step): sim/reducer.py
                        "reducer": {t: {k: v[k] for k in ("s", "cpu_s", "unit", "source")} for t, v in cal.reducer.items()}})
    if cal.nnodes > 1:
        assumptions.update(_across_nodes(cal))
    return _Target(job, cluster, worlds, f"trainscale plan: {job.name} on this machine ({cal.cores} cores)")


def _across_nodes(cal: Any) -> dict[str, Any]:
    """What a calibration across nodes measured of the hierarchical all-reduce, for the plan's assumptions."""
    if not cal.across_hier:  # a file from before it was measured
        return {"hierarchical_allreduce": "the node's all-reduce plus the link's, each measured (not measured "
                                          "itself: re-run `trainscale plan calibrate` across the nodes)"}
    return {"hierarchical_allreduce": f"measured across {cal.nnodes} nodes as strategy.hierarchical's DDP hook runs "
                                      "it (node reduce-scatter, all-reduce across, node all-gather)",
            # the hierarchical forecast at these P is anchored on the skeleton measured with that exchange
            "skeleton_hierarchical_step_s": {p: round(v["step_s"], 5) for p, v in cal.replay_hier.items()}}


def _forecast(a: argparse.Namespace, target: _Target, strategy: Any, measured: dict[int, float],
              assumptions: dict[str, Any], cal: Any = None) -> tuple[list[Any], list[str], Compared | None]:
    """The points, the conclusions (gaps to the measured speed-ups, the strategy to use) and the comparison."""
    from ..costs.forecast import forecast
    from ..costs.verdict import NOT_MODELLED, gaps
    from .terms import forecast_terms

    points = forecast(target.job, target.cluster, strategy, target.worlds)
    given = {"one_device_step_s": "given (--samples-per-s-1)"} if a.samples_per_s_1 else {}
    assumptions["terms"] = forecast_terms(target.job, target.cluster, strategy, measured=not a.gpu, given=given)
    if a.gpu:
        from .terms import with_scale_terms

        measured_terms = cal.measured_terms() if cal is not None else {}
        points = with_scale_terms(points, target.job, a.framework_overhead, a.host_sync, a.gpu, a.fsdp_units,
                                  assumptions, measured_terms)
    assumptions["not_modelled"] = "; ".join(NOT_MODELLED)
    notes = gaps(points, measured)
    compare = _compare(target.job, target.cluster, strategy, target.worlds) if a.compare else None
    for w, ranked in compare or []:
        default = [r[1] for r in ranked if r[0] == strategy.label()]
        notes.append(f"{w} devices: use {ranked[0][0]} ({ranked[0][1]:,.1f} samples/s, {ranked[0][2]:.0%} efficiency)"
                     f"; the default gives {default[0]:,.1f}" if default else f"{w} devices: use {ranked[0][0]}")
    return points, notes, compare
