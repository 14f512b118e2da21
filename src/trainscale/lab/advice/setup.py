"""Configuration causes of a script instrumented from outside: what its setup costs, measured where it can be.

Pure code over one run summary's ``injected`` facts (counted on rank 0 by ``trainscale.inject``): DDP's
``find_unused_parameters`` (its graph walk after every forward, timed), a bucket cap below DDP's default
(more all-reduces than the gradients need), gradient accumulation that exchanges on
every micro-batch (forwards whose backward all-reduces, counted per optimizer step), more compute threads
than cores (intra-op threads and loader workers per process), host syncs per step (counted on a GPU), one
rank serving the data (accelerate's dispatcher) and a collective every step that a setting of the script asks
for (Lightning's ``self.log(..., sync_dist=True)``, the Trainer's token count averaged over the devices). Each is
a row with its measured seconds per step (None where it cannot be measured, and the row says why) and the change
in the framework's own terms.

Example::

    rows = setup_causes(summary_at_n, step_time_n_s=0.012)
"""

from __future__ import annotations

import math
from typing import Any

from .script import bucket_change, fit_threads, narrowed_affinity, script_context, small_buckets

__all__ = ["setup_causes"]

# Where each framework takes the setting (the driver's name, as ``trainscale.inject.frameworks`` reports it).
_UNUSED_OFF = {"Hugging Face Trainer": "TrainingArguments(ddp_find_unused_parameters=False)",
               "Lightning Trainer": 'Trainer(strategy="ddp") (not "ddp_find_unused_parameters_true")',
               "Lightning Fabric": 'Fabric(strategy="ddp") (not DDPStrategy(find_unused_parameters=True))',
               "accelerate": "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters="
                             "False)])"}
_NO_SYNC = {"accelerate": "with accelerator.accumulate(model): ... (Accelerator(gradient_accumulation_steps=K))",
            "Lightning Trainer": "Trainer(accumulate_grad_batches=K) instead of stepping by hand",
            "Lightning Fabric": "with fabric.no_backward_sync(model, enabled=not last): ...",
            "Hugging Face Trainer": "TrainingArguments(gradient_accumulation_steps=K)"}

_UNDISPATCH = {"accelerate": "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False)) with a "
                             "dataset each rank reads its own part of",
               "Hugging Face Trainer": 'TrainingArguments(accelerator_config={"dispatch_batches": False}) with a '
                                       "dataset each rank reads its own part of"}


def setup_causes(summary: dict[str, Any], step_time_n_s: float) -> list[dict[str, Any]]:
    """The configuration causes of the N-process run ``summary`` (empty for a run on the run API)."""
    inj = summary.get("injected") or {}
    setup, ddp, fw = inj.get("setup") or {}, inj.get("ddp") or [], (inj.get("framework") or {}).get("name", "")
    ctx = script_context(summary)  # the script's settings, as the advice reads them
    rows = []
    if ddp and ddp[0].get("find_unused_parameters"):
        rows.append(_find_unused(ddp[0], setup, fw, step_time_n_s))
    if ddp and small_buckets(ctx):
        rows.append(_buckets(ctx, fw))
    micro, exchanges = setup.get("micro_batches_per_step") or 1, setup.get("exchanges_per_step") or 0
    if ddp and micro > 1 and exchanges >= micro:
        rows.append({"name": "exchange_every_micro_batch", "seconds_per_step": None,
                     "evidence": f"{exchanges} of {micro} micro-batches per optimizer step all-reduce their gradients "
                                 "(only the last one needs to)",
                     "advice": "skip the exchange on all but the last micro-batch: "
                               + _NO_SYNC.get(fw, "with model.no_sync(): for every micro-batch but the last")})
    syncs = setup.get("host_syncs_per_step")
    if syncs:
        rows.append(_host_syncs(syncs, setup.get("host_sync_sites") or []))
    rows += _own_collectives(summary.get("framework_collectives") or {})
    if setup.get("one_rank_serves_data"):
        rows.append({"name": "one_rank_serves_data", "seconds_per_step": None,
                     "evidence": "accelerate's DataLoaderDispatcher: rank 0 reads every batch of every rank and "
                                 "sends each its slice (dispatch_batches, the default for an IterableDataset); its "
                                 "cost is in the input share the no_data experiment measures",
                     "advice": "let each rank read its own data: " + _UNDISPATCH.get(
                         fw, "dispatch_batches=False, with a dataset each rank reads its own part of")})
    threads, workers = setup.get("threads") or 1, setup.get("loader_workers") or 0
    procs, cores = setup.get("processes_per_node") or 1, setup.get("cores") or 1
    if (narrowed := narrowed_affinity(ctx)) is not None:
        rows.append({"name": "cpu_affinity", "seconds_per_step": None,
                     "evidence": f"each process may run on {cores} core(s) of the {setup['cores_at_start']} it was "
                                 "started with: the script (or a package it imports) narrowed its CPU affinity, and "
                                 f"its {workers} loader worker(s) and {threads} intra-op thread(s) share what is left",
                     "advice": narrowed})
    if procs * (threads + workers) > cores:
        rows.append({"name": "threads", "seconds_per_step": None,
                     "evidence": f"{procs} processes x ({threads} intra-op threads + {workers} loader workers) = "
                                 f"{procs * (threads + workers)} busy threads on {cores} cores",
                     "advice": f"give each process at most {max(1, cores // procs)} busy threads in all: "
                               + fit_threads(cores // procs, threads, workers)})
    return rows


def _buckets(ctx: dict[str, Any], fw: str) -> dict[str, Any]:
    """A bucket cap below DDP's default: more all-reduces per step than the gradients need, each paying latency."""
    return {"name": "bucket_size", "seconds_per_step": None,
            "evidence": f"DDP's bucket_cap_mb is {ctx['bucket_mb']:.3g} (DDP's default is 25): the gradients travel "
                        f"in {ctx['buckets']} all-reduces per exchange, each paying the collective's latency; their "
                        "cost is in the communication term the no_comm experiment measures",
            "advice": f"fuse them into fewer, larger all-reduces: {bucket_change(fw)}"}


def _find_unused(ddp: dict[str, Any], setup: dict[str, Any], fw: str, step_s: float) -> dict[str, Any]:
    logged = ddp.get("logging_data")
    data: dict[str, Any] = logged if isinstance(logged, dict) else {}
    unused = data.get("unused_parameter_size")
    raw = setup.get("find_unused_walk_s_per_step")
    walk = float(raw) if isinstance(raw, (int, float)) else math.nan
    measured = math.isfinite(walk)
    size = (f"DDP's walk of the autograd graph after each forward took {walk * 1e3:.3f} ms per step "
            f"({walk / step_s:.1%} of the step)" if measured and step_s > 0 else
            "its walk of the autograd graph could not be timed (no DDP._post_forward in this PyTorch)")
    found = ("; DDP found no unused parameter (unused_parameter_size 0)" if unused == 0 else
             f"; {unused} bytes of parameters went unused" if unused else "")
    change = _UNUSED_OFF.get(fw, "DistributedDataParallel(model, find_unused_parameters=False)")
    return {"name": "find_unused_parameters", "seconds_per_step": walk if measured else None,
            "evidence": f"find_unused_parameters=True: {size}{found}",
            "advice": f"turn it off where every parameter gets a gradient each step: {change}" if unused == 0 or
                      unused is None else "keep it: some parameters get no gradient in a step"}


def _host_syncs(per_step: float, sites: list[dict[str, Any]]) -> dict[str, Any]:
    """Host syncs per step, with the lines that made them and advice for what those lines do."""
    where = "; ".join(f"{s['where']} `{s['code']}` ({s['per_step']:g}/step)" if s["code"] else s["where"]
                      for s in sites)
    copies = any(".to(" in s["code"] or ".cuda(" in s["code"] for s in sites)
    advice = ("copy batches without waiting: pinned host memory (DataLoader(..., pin_memory=True)) and "
              ".to(device, non_blocking=True); a copy from pageable memory makes the host wait for it" if copies
              else "keep values on the device between log points: read losses and metrics every K steps, check "
                   "finiteness on the device (torch.isfinite(...).all() without .item())")
    return {"name": "host_syncs", "seconds_per_step": None,
            "evidence": f"{per_step:g} host sync(s) per step" + (f", at {where}" if where else "")
                        + ": each time the host waits for the device's queue to drain (.item(), .cpu(), a blocking "
                          "copy, a tensor's value in an if); counted, not timed apart",
            "advice": advice}


# A framework's collective every step that a setting of the script turns on, told by the user's line or the
# framework's function that called it: the change that removes it.
_OWN_ADVICE = (("sync_dist=True", "log it once an epoch, self.log(..., on_step=False, on_epoch=True, sync_dist=True), or "
                                  "without sync_dist for the step's own value (each rank logs its own; rank 0's shows)"),
               ("get_batch_samples", "TrainingArguments(average_tokens_across_devices=False): the Trainer gathers every "
                                     "batch's token count to average the loss over all devices' tokens"))


def _own_collectives(own: dict[str, Any]) -> list[dict[str, Any]]:
    """A row for each line (or framework function) that runs collectives every step because of a setting the user
    can change (none: no row); Lightning's ``sync_dist`` makes a barrier and an all_reduce: one row."""
    per_step = own.get("calls_per_step") or {}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for site in own.get("sites") or []:
        advice = next((a for key, a in _OWN_ADVICE if key in site["code"] or key in site["via"]), None)
        if advice is None or per_step.get(site["function"], 0) < 0.5:
            continue
        where = f"{site['where']} `{site['code']}`" if site["where"] else "the framework's loop"
        chain = site["via"].split(" < ")
        row = rows.setdefault((where, advice), {"calls": [], "via": " < ".join(
            chain if len(chain) <= 3 else [chain[0], "...", *chain[-2:]])})
        row["calls"].append(f"{site['function']} x{per_step[site['function']]:.2g}")
    return [{"name": "collective_every_step", "seconds_per_step": None,
             "evidence": f"{' and '.join(r['calls'])} a step from {where} (via {r['via'] or '-'}): every rank waits "
                         "in it for the slowest; its time is in the communication cause's share of the framework's "
                         "own collectives",
             "advice": advice} for (where, advice), r in rows.items()]
