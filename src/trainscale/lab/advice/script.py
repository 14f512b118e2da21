"""Advice for a script trainscale did not write: each cause's change in the script's own code and framework.

A script instrumented from outside ignores trainscale's flags, so its advice names what to change in the
script: DDP's or its framework's own arguments (``bucket_cap_mb``, gradient accumulation without an exchange
on every micro-batch), its ``DataLoader``, its thread counts. What the advice is sized by is what the injected
run recorded (DDP's logging data, the loader's workers, the per-device batch, the threads), never trainscale's
defaults. The doctor's analysis decides as it does for any job; only the wording of its advice changes here.

Example::

    ctx = script_context(summary_at_n)          # one injected run summary
    for_script(result, ctx)                     # every cause's suggestion in the script's own terms
"""

from __future__ import annotations

import math
from typing import Any

from ..decomposition import what_if
from .suggest import LATENCY_BOUND_BYTES, fsdp_change, suggest

__all__ = ["script_context", "exchange_facts", "exchange_text", "exchange_advice", "input_advice", "script_advice",
           "for_script", "cannot_apply", "bucket_change", "small_buckets", "fit_threads", "narrowed_affinity"]

DDP_DEFAULT_CAP_MB = 25.0  # DistributedDataParallel(bucket_cap_mb=25) unless the script sets it

# Where each framework takes a setting (the driver's name, as ``trainscale.inject.frameworks`` reports it);
# plain PyTorch's wording is the default.
_BUCKET = {"PyTorch": "DistributedDataParallel(model, bucket_cap_mb={mb})",
           "Hugging Face Trainer": "TrainingArguments(ddp_bucket_cap_mb={mb})",
           "Lightning Trainer": "Trainer(strategy=DDPStrategy(bucket_cap_mb={mb}))",
           "Lightning Fabric": "Fabric(strategy=DDPStrategy(bucket_cap_mb={mb}))",
           "accelerate": "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb={mb})])"}
_ACCUMULATE = {"PyTorch": "step the optimizer every {k} micro-batches and run all but the last under "
                          "`with model.no_sync():`",
               "accelerate": "Accelerator(gradient_accumulation_steps={k}) with `with accelerator.accumulate(model):` "
                             "around each micro-batch",
               "Lightning Trainer": "Trainer(accumulate_grad_batches={k})",
               "Lightning Fabric": "step every {k} micro-batches, all but the last under "
                                   "`with fabric.no_backward_sync(model, enabled=not last):`",
               "Hugging Face Trainer": "TrainingArguments(gradient_accumulation_steps={k})"}
_BATCH = {"Hugging Face Trainer": "TrainingArguments(per_device_train_batch_size={b})"}
_LOADER = {"Hugging Face Trainer": "TrainingArguments(dataloader_num_workers={w}, dataloader_persistent_workers=True, "
                                   "dataloader_prefetch_factor=4{pin})"}
_AMP = {"Hugging Face Trainer": "TrainingArguments(bf16=True)", "Lightning Trainer": 'Trainer(precision="bf16-mixed")',
        "Lightning Fabric": 'Fabric(precision="bf16-mixed")', "accelerate": 'Accelerator(mixed_precision="bf16")'}
_THREADS = "torch.set_num_threads({t}) in the script or OMP_NUM_THREADS={t} in its environment"


def _num(v: Any) -> float | None:
    """``v`` as a finite float, else None (a bool, a string, NaN or a missing value)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def exchange_facts(summary: dict[str, Any]) -> dict[str, Any]:
    """What the script's DDP exchanges per step, from DDP's own logging data (keys are None where unknown)."""
    ddp = (summary.get("injected") or {}).get("ddp") or []
    setup = (summary.get("injected") or {}).get("setup") or {}
    sizes = [d.get("bucket_sizes_bytes") for d in ddp]
    grads = [_num(d.get("gradient_bytes")) for d in ddp]
    caps = [_num(d.get("bucket_bytes")) for d in ddp]
    overlap = [_num(d.get("overlap_frac")) for d in ddp]
    comm = [_num(d.get("comm_s")) for d in ddp]
    return {"instances": len(ddp),
            "cap_mb": caps[0] / 2**20 if caps and caps[0] is not None else None,
            "buckets": sum(len(s) for s in sizes) if sizes and all(sizes) else None,
            "gradient_bytes": sum(g for g in grads if g is not None) if grads and all(g is not None for g in grads)
            else None,
            "overlap_frac": overlap[0] if len(overlap) == 1 else None, "comm_s": comm[0] if len(comm) == 1 else None,
            "exchanges": _num(setup.get("exchanges_per_step")), "micro": _num(setup.get("micro_batches_per_step")),
            "calls": _num(summary.get("allreduce_calls_per_step"))}


def _size(nbytes: float) -> str:
    """Bytes as KB or MB with the precision the evidence lines use."""
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:.1f} KB"


def exchange_text(summary: dict[str, Any]) -> str:
    """The script's exchange in words, from what DDP recorded; what is unknown is left out, never printed as None."""
    f = exchange_facts(summary)
    if not f["instances"]:
        return "no DistributedDataParallel seen in the script"
    parts = [f"DDP all-reduces {_size(f['gradient_bytes'])} of gradients" if f["gradient_bytes"] is not None else
             "DDP all-reduces the gradients"]
    if f["buckets"] is not None:
        parts.append(f" in {f['buckets']} bucket(s)")
    if f["cap_mb"] is not None:
        default = ", DDP's default" if abs(f["cap_mb"] - DDP_DEFAULT_CAP_MB) < 1e-9 else ""
        parts.append(f" (bucket_cap_mb {f['cap_mb']:.3g}{default})")
    if f["calls"] is not None:
        parts.append(f", {f['calls']:g} all-reduce call(s) per optimizer step")
    if f["comm_s"] is not None and f["overlap_frac"] is not None:
        # DDP times only the iterations it samples (its first 10, then every 100th): warm-up weighs on the mean.
        parts.append(f"; DDP's own clock: its all-reduces took {f['comm_s'] * 1e3:.2f} ms per backward, "
                     f"{f['overlap_frac']:.0%} of that overlapping backward compute (its first 10 iterations, then "
                     "every 100th, warm-up included)")
    elif f["overlap_frac"] is not None:
        parts.append(f"; DDP measured {f['overlap_frac']:.0%} of its all-reduce time overlapping backward compute")
    return "".join(parts)


def script_context(summary: dict[str, Any]) -> dict[str, Any]:
    """The suggestions' context for an injected run: the script's own settings as its run recorded them.

    It has the keys the run API's context has (``suggest.context_from_config``), so the analysis decides as for
    any job, with no trainscale option fields: no suggestion it makes can name one to try.
    """
    inj = summary.get("injected") or {}
    setup, f, fsdp = inj.get("setup") or {}, exchange_facts(summary), summary.get("fsdp") or {}
    return {"script": True, "framework": (inj.get("framework") or {}).get("name", "PyTorch"),
            "bucket_mb": f["cap_mb"], "overlap": True,  # DDP starts each bucket's all-reduce as soon as it fills
            "buckets": f["buckets"], "gradient_bytes": f["gradient_bytes"], "overlap_frac": f["overlap_frac"],
            "calls": f["calls"], "bytes": f["gradient_bytes"],
            "workers": setup.get("loader_workers") or 0, "batch_size": summary.get("batch_size"),
            "threads": setup.get("threads") or summary.get("threads"), "threads_cfg": 0,
            "processes_per_node": setup.get("processes_per_node"), "cores": setup.get("cores"),
            "cores_at_start": setup.get("cores_at_start") or setup.get("cores"),
            "slow_rank": -1, "sample_delay_ms": 0.0, "compression": "none", "local_sgd_period": 0,
            "fsdp": bool(fsdp), "reshard_after_forward": fsdp.get("reshard_after_forward", True),
            "fsdp_reduce_dtype": fsdp.get("reduce_dtype", "fp32"), "strategy_fields": [], "data_fields": [],
            "device": summary.get("device")}


def _in(table: dict[str, str], fw: str, default: str, **kw: Any) -> str:
    """``fw``'s wording from ``table`` (plain PyTorch's ``default`` otherwise), filled in."""
    return table.get(fw, default).format(**kw)


def _batch(ctx: dict[str, Any]) -> str:
    """A per-device batch twice the script's (its DataLoader's, or the framework's argument)."""
    b = _num(ctx.get("batch_size"))
    now = int(b) if b and b > 0 else 0
    what = _in(_BATCH, ctx.get("framework", ""), "DataLoader(..., batch_size={b})", b=2 * now or "2 x yours")
    return f"a larger per-device batch ({what}{f', now {now}' if now else ''}, with the learning rate scaled)"


def _accumulate(ctx: dict[str, Any], k: int = 2) -> str:
    """Gradient accumulation over ``k`` micro-batches, exchanging only on the last, in the script's framework."""
    if ctx.get("fsdp") and ctx.get("framework", "PyTorch") == "PyTorch":  # FSDP2 has no no_sync()
        return (f"step the optimizer every {k} micro-batches with `model.set_requires_gradient_sync(last)` before "
                "each backward")
    return _in(_ACCUMULATE, ctx.get("framework", ""), _ACCUMULATE["PyTorch"], k=k)


def bucket_change(framework: str, mb: float = DDP_DEFAULT_CAP_MB) -> str:
    """Where ``framework`` takes DDP's bucket size, set to ``mb``."""
    return _in(_BUCKET, framework, _BUCKET["PyTorch"], mb=f"{mb:g}")


def small_buckets(ctx: dict[str, Any]) -> bool:
    """Whether the script's DDP splits its gradients into several buckets under a cap below DDP's default."""
    cap, buckets = ctx.get("bucket_mb"), ctx.get("buckets")
    return isinstance(cap, (int, float)) and cap < DDP_DEFAULT_CAP_MB and (buckets or 0) > 1


def exchange_advice(ctx: dict[str, Any]) -> str:
    """DDP's exchange: fuse small buckets, else exchange less often or over more samples, in the script's terms;
    FSDP's: gather once a step, then reduce in half the bytes, then amortise."""
    if ctx.get("fsdp"):
        return _fsdp_exchange(ctx)
    grads = ctx.get("gradient_bytes")
    if small_buckets(ctx):
        return (f"fuse the gradients into fewer, larger all-reduces: {bucket_change(ctx.get('framework', ''))} (now "
                f"bucket_cap_mb {ctx['bucket_mb']:.3g}: {ctx['buckets']} buckets, each all-reduce paying its latency)")
    why = (f"{_size(grads)} of gradients per step is latency-bound, so " if isinstance(grads, (int, float))
           and 0 < grads < LATENCY_BOUND_BYTES else "")
    return (f"{why}exchange less often: accumulate gradients over 2 micro-batches ({_accumulate(ctx)}), or amortise "
            f"each exchange over {_batch(ctx)}")


def _fsdp_exchange(ctx: dict[str, Any]) -> str:
    """FSDP's exchange (``suggest.fsdp_change``) as a change to the script's ``fully_shard`` calls."""
    change = fsdp_change(ctx)
    if change == "reshard":
        return ("keep each unit's parameters gathered from forward to backward: fully_shard(block, "
                "reshard_after_forward=False) (one all-gather per unit and step instead of two; each rank then holds "
                "the whole unsharded parameters through backward)")
    if change == "reduce_dtype":
        return ("reduce-scatter the gradients in bf16: fully_shard(..., mp_policy=MixedPrecisionPolicy("
                "reduce_dtype=torch.bfloat16)) (half the bytes; the sharded update stays fp32)")
    return f"amortise each step's gathers over more samples: {_batch(ctx)}"


def input_advice(ctx: dict[str, Any], competes: bool = False) -> str:
    """Load in parallel and ahead of the step, or (when the loader competes with the step for cores) cheaper."""
    if (narrowed := narrowed_affinity(ctx)) is not None:
        return narrowed + ", then load in parallel and ahead of the step"
    if competes:
        return (f"give loading cores of its own (processes x threads ({_THREADS.format(t='T')}) + loader workers <= "
                "cores), or make it cheaper (keep samples uint8 until the device); more loader workers would take more")
    w = max(2, 2 * int(ctx.get("workers") or 0))
    gpu = ctx.get("device") == "cuda"  # pinned host memory speeds copies to a GPU; on a CPU job it only costs
    hf = ctx.get("framework") == "Hugging Face Trainer"
    pin = (", dataloader_pin_memory=True" if hf else ", pin_memory=True") if gpu else ""
    loader = _in(_LOADER, ctx.get("framework", ""), "DataLoader(..., num_workers={w}, persistent_workers=True, "
                 "prefetch_factor=4{pin})", w=w, pin=pin)
    return (f"load in parallel and ahead of the step: {loader} (now {int(ctx.get('workers') or 0)} worker(s)); keep "
            "samples uint8 until the device")


def _cores_text() -> str:
    """Cores of its own for each process, with the script's own thread setting."""
    return (f"give each process cores of its own ({_THREADS.format(t='T')} so that processes x T + loader workers "
            "<= cores; taskset -c / numactl)")


def narrowed_affinity(ctx: dict[str, Any]) -> str | None:
    """The change to make first when the script narrowed its own CPU affinity (None when it did not).

    A package that pins the process to a core at import (pytorch#82219, #101850) leaves the loader workers and
    intra-op threads it starts afterwards on that core, while the others the process was given stay idle.
    """
    now, start = int(ctx.get("cores") or 0), int(ctx.get("cores_at_start") or 0)
    if not now or start <= now:
        return None
    return (f"restore the CPU affinity that the script, or a package it imports, narrowed from {start} to {now} "
            "core(s): saved = os.sched_getaffinity(0) before the imports, os.sched_setaffinity(0, saved) after them "
            "(loader workers and threads started later inherit it)")


def fit_threads(per_process: int, threads: int, workers: int) -> str:
    """The change that fits one process's intra-op threads and loader workers in ``per_process`` cores: fewer
    threads where there are several, else fewer loader workers (a process keeps at least one thread)."""
    per = max(1, per_process)
    if threads > 1 or workers == 0:
        return (f"{_THREADS.format(t=max(1, per - workers))}, so that threads + loader workers <= {per} a process "
                f"(now {threads} + {workers})")
    return (f"DataLoader(..., num_workers={max(0, per - threads)}) (now {workers}: with {threads} intra-op thread(s) "
            f"that makes {threads + workers} busy threads a process on {per} core(s) each)")


def _contention(c: dict[str, Any], ctx: dict[str, Any], n: int) -> str:
    """CPU contention by whose threads held the cores (``c['who']``), with the script's own knobs."""
    who = c.get("who") or {}
    if who.get("outside"):
        return str(c.get("suggestion") or "")  # names the outside processes: nothing of the script's to change
    if (narrowed := narrowed_affinity(ctx)) is not None:
        return narrowed
    cores, workers, threads = int(who.get("cores") or 0), int(ctx.get("workers") or 0), int(ctx.get("threads") or 1)
    if who.get("oversubscribed") and cores:
        return f"the job oversubscribes the cores: {fit_threads(cores // max(1, n), threads, workers)}"
    if who.get("exchange_on_cpu"):
        if threads > 1:
            return (f"leave each process a core for its exchange (Gloo runs it on CPU threads): "
                    f"{_THREADS.format(t=threads - 1)}")
        return (f"give each process a core for its exchange (fewer processes than cores, Gloo runs it on CPU "
                f"threads), or exchange less often ({_accumulate(ctx)})")
    return str(c.get("suggestion") or "")


def script_advice(c: dict[str, Any], ctx: dict[str, Any], n: int) -> str:
    """One cause's change in the script's own terms (``c``: the cause as the analysis made it)."""
    name = c["name"]
    if name == "communication":
        return exchange_advice(ctx)
    if name == "input":
        return input_advice(ctx, bool(c.get("loader_competes")))
    if name == "sync_wait":
        return (f"make steps steadier, so that no rank keeps the others waiting: {_cores_text()}, keep other work "
                f"off the machine; or synchronise less often ({_accumulate(ctx)}: one exchange per 2 micro-batches, "
                "whose jitter averages out)")
    if name == "framework_overhead":
        return f"the per-step work grows with processes: amortise it over {_batch(ctx)} or {_accumulate(ctx)}"
    if name == "compute_interference":
        return ("processes slow each other's compute (shared cores, memory bandwidth, PCIe): fewer processes per "
                f"machine, {_THREADS.format(t='T')} so that processes x T <= cores, check the topology "
                "(nvidia-smi topo -m)")
    if name == "threads":
        return f"use {c.get('threads')} intra-op thread(s) per process: {_THREADS.format(t=c.get('threads'))}"
    if name == "cpu_contention":
        return _contention(c, ctx, n)
    if name in ("straggler", "slow_operator"):  # a rank or an operator named: no setting of the script's to change
        return suggest(name, {**ctx, "rank": c.get("rank", 0), "op": c.get("operator")})[0]
    return str(c.get("suggestion") or "")  # external_load: the outside processes, named


def _bottleneck_advice(b: dict[str, Any], ctx: dict[str, Any]) -> str:
    """The bounding part's advice in the script's terms."""
    name, shares = b.get("name"), b.get("shares") or {}
    if name == "input":
        return f"the job waits for its input {shares.get('input', 0.0):.0%} of the step: {input_advice(ctx)}"
    if name == "communication":
        return exchange_advice(ctx)
    if name == "cpu_contention":
        return f"the ranks' threads wait for a free core: {_cores_text()} and move other work off the machine"
    if name == "compute":
        gpu = ctx.get("device") == "cuda"
        # On a CPU, bf16 is emulated on most cores and slower than fp32: offered on a GPU only.
        amp = (" bf16 mixed precision where it is not on yet (" + _in(_AMP, ctx.get("framework", ""), "torch.autocast("
               "'cuda', dtype=torch.bfloat16) around the forward and the loss") + ")," if gpu else "")
        return (f"the step is the model's own work on the {'GPU' if gpu else 'CPU'} "
                f"({shares.get('compute', math.nan):.0%}): the processes scale it; to make each step cheaper use{amp} "
                f"torch.compile, or amortise the per-step work over {_batch(ctx)}")
    return str(b.get("advice") or "")  # waiting_for_peers: a rank named, no option of trainscale's


def for_script(result: dict[str, Any], ctx: dict[str, Any]) -> None:
    """Rewrite every suggestion of ``result`` (causes, bottleneck, what-if) as a change to the script itself.

    ``--apply`` has nothing to try on a script trainscale did not write, so no cause keeps flags to apply.
    """
    n = int(result.get("nproc") or 2)
    for c in result.get("causes") or []:
        c["suggestion"], c["apply_flags"] = script_advice(c, ctx, n), {}
    b = result.get("bottleneck")
    if b and b.get("name"):
        b["advice"], b["apply_flags"] = _bottleneck_advice(b, ctx), {}
    if "what_if" in result:
        result["what_if"] = what_if(result)


def cannot_apply(result: dict[str, Any], script: list[str] | None) -> dict[str, Any]:
    """``--apply`` on a script trainscale did not write: the one line that says so and names the change to make."""
    top = next((c for c in result.get("causes") or [] if c.get("significant")), None)
    where = " ".join(script or []) or "your script"
    change = (f"the change for {top['name']} is yours to make, then run the doctor again to measure it: "
              f"{top['suggestion']}" if top else "no cause is clear above the noise, so there is no change to make")
    return {"cause": None, "not_applied": True,
            "text": f"--apply cannot change a script trainscale did not write ({where}): {change}"}
