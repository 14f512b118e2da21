"""Concrete changes for each cause, naming only trainer flags that exist in this version."""

from __future__ import annotations

from typing import Any

__all__ = ["suggest", "context_from_config"]

LATENCY_BOUND_BYTES = 1e6  # gradients per step below which an exchange costs its latency rather than its bytes


def context_from_config(cfg: Any) -> dict[str, Any]:
    """What suggestions depend on: the job's own settings and which strategy/data flags exist."""
    import dataclasses

    return {"bucket_mb": cfg.strategy.bucket_mb, "overlap": cfg.strategy.overlap, "workers": cfg.data.workers,
            "batch_size": cfg.data.batch_size, "slow_rank": cfg.job.slow_rank, "sample_delay_ms":
            cfg.data.sample_delay_ms, "threads_cfg": cfg.job.threads,
            "compression": getattr(cfg.strategy, "compression", "none"),
            "local_sgd_period": getattr(cfg.strategy, "local_sgd_period", 0),
            "fsdp": cfg.strategy.fsdp, "reshard_after_forward": cfg.strategy.reshard_after_forward,
            "fsdp_reduce_dtype": cfg.strategy.fsdp_reduce_dtype,
            "strategy_fields": [f.name for f in dataclasses.fields(cfg.strategy)],
            "data_fields": [f.name for f in dataclasses.fields(cfg.data)]}


def suggest(cause: str, ctx: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """(advice, flags that ``--apply`` can try); flags are empty when the fix is outside the job's options."""
    sf, df = ctx.get("strategy_fields", []), ctx.get("data_fields", [])
    if cause == "communication" and ctx.get("fsdp"):
        return _fsdp_exchange(ctx)
    if cause == "communication":
        return _ddp_exchange(ctx, sf)
    if cause == "sync_wait":
        return ("make steps steadier, so that no rank keeps the others waiting: give each process cores of its own "
                "(--job.threads so that threads x processes <= cores, taskset -c / numactl), keep other work off the "
                "machine; or synchronise less often (--strategy.grad_accum 2: one exchange per 2 micro-batches, "
                "whose jitter averages out)", {})
    if cause == "input":
        extra = " and --data.prefetch 4" if "prefetch" in df else ""
        if ctx.get("sample_delay_ms"):
            return (f"storage is slow (data.sample_delay_ms {ctx['sample_delay_ms']:g} is set: simulated slow "
                    "disk); remove it, or cache the data set on a faster local disk", {"data.sample_delay_ms": "0"})
        workers = max(2, 2 * int(ctx.get("workers") or 0))
        return (f"load in parallel and ahead of the step: --data.workers {workers}{extra}; keep samples uint8 "
                "until the device", {"data.workers": str(workers)})
    if cause == "straggler":
        rank = ctx.get("rank", 0)
        if ctx.get("slow_rank", -1) >= 0:
            return (f"rank {rank} is the injected straggler (job.slow_rank {ctx['slow_rank']}); remove "
                    "--job.slow_rank to run at full speed", {"job.slow_rank": "-1"})
        return (f"rank {rank} is slower than the others: check its device (clocks, temperature, other processes "
                "on it, PCIe link) or exclude that host", {})
    if cause == "slow_operator":
        return (f"{ctx.get('op')} slows down only with several processes: look at what it does differently "
                "(synchronisation, a size that grows with world size, memory placement)", {})
    if cause == "framework_overhead":
        return (f"the framework's per-step work grows with processes even when compute is a sleep: amortise it "
                f"with a larger per-device batch (--batch-size {2 * int(ctx.get('batch_size', 32))}) or "
                "--strategy.grad_accum 2", {"data.batch_size": str(2 * int(ctx.get("batch_size", 32)))})
    if cause == "compute_interference":
        return ("processes slow each other's compute (shared cores, memory bandwidth, PCIe): fewer processes per "
                "machine, set --job.threads so that threads x processes <= cores, check the topology "
                "(nvidia-smi topo -m)", {})
    if cause == "threads":
        return f"use --job.threads {ctx.get('threads')}", {"job.threads": str(ctx.get("threads"))}
    return "", {}


def _ddp_exchange(ctx: dict[str, Any], sf: list[str]) -> tuple[str, dict[str, str]]:
    """DDP's exchange: fuse small buckets, overlap, then send less, synchronise less often, or amortise it."""
    bucket, calls = ctx.get("bucket_mb", 25.0), int(ctx.get("calls") or 0)
    if isinstance(bucket, (int, float)) and bucket < 25 and calls != 1:
        return (f"fuse gradients into bigger all-reduce buckets: --strategy.bucket_mb 25 (now {bucket:g}: "
                f"{calls or 'many'} small all-reduces per step, each paying the latency)", {"strategy.bucket_mb": "25"})
    if not ctx.get("overlap", True):
        return ("overlap the all-reduce with backward: --strategy.overlap true", {"strategy.overlap": "true"})
    sent = float(ctx.get("bytes") or 0)
    # Under ~1 MB a step's exchange costs its latency, not its bytes: sending half as much saves little and
    # the casts cost compute (measured here: fp16 on a 340 KB MLP, 26% slower); exchange less often instead.
    latency_bound = 0 < sent < LATENCY_BOUND_BYTES
    if "compression" in sf and ctx.get("compression", "none") == "none" and sent >= LATENCY_BOUND_BYTES:
        return (f"send less: --strategy.compression fp16 ({sent / 1e6:.1f} MB of gradients per step now)",
                {"strategy.compression": "fp16"})
    if "local_sgd_period" in sf and not ctx.get("local_sgd_period"):
        why = f"{sent / 1e3:.0f} KB per step is latency-bound; " if latency_bound else ""
        return (f"synchronise less often: {why}--strategy.local_sgd_period 4 (parameters averaged every 4 steps; "
                "this changes the optimisation, so check the accuracy)",
                {"strategy.local_sgd_period": "4"})
    batch = 2 * int(ctx.get("batch_size", 32))
    return (f"gradients already travel in {calls or 'few'} bucket(s); amortise each exchange over more samples "
            f"with a larger per-device batch (--batch-size {batch}, with --optim.lr_scaling linear)",
            {"data.batch_size": str(batch)})


def fsdp_change(ctx: dict[str, Any]) -> str:
    """FSDP's next change: gather once per step where memory allows (``reshard``), else reduce in half the bytes
    (``reduce_dtype``), else amortise over a larger batch (``batch``); the run API and a script word it apart."""
    if ctx.get("reshard_after_forward", True):
        return "reshard"
    return "reduce_dtype" if ctx.get("fsdp_reduce_dtype", "fp32") == "fp32" else "batch"


def _fsdp_exchange(ctx: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """FSDP's exchange (``fsdp_change``) in the run API's options."""
    change = fsdp_change(ctx)
    if change == "reshard":
        return ("keep each unit's parameters gathered from forward to backward: --strategy.reshard_after_forward "
                "false (one all-gather per unit and step instead of two; each rank then holds the whole "
                "unsharded parameters through backward)", {"strategy.reshard_after_forward": "false"})
    if change == "reduce_dtype":
        return ("reduce-scatter gradients in bf16: --strategy.fsdp_reduce_dtype bf16 (half the bytes; the "
                "sharded update stays fp32)", {"strategy.fsdp_reduce_dtype": "bf16"})
    batch = 2 * int(ctx.get("batch_size", 32))
    return (f"amortise each step's gathers over more samples with a larger per-device batch (--batch-size {batch}, "
            "with --optim.lr_scaling linear)", {"data.batch_size": str(batch)})
