"""Configuration causes met in a script's run: host syncs per step (counted on a GPU, said not measured on CPU),
one rank serving every rank's data (accelerate's dispatcher), an exchange on every micro-batch, a CPU affinity the
script narrowed."""

from __future__ import annotations

import os
import warnings

import pytest
from inject_helpers import injected

from trainscale.inject.syncs import NOT_ON_CPU, SyncCounter
from trainscale.lab.advice.script import script_advice, script_context
from trainscale.lab.advice.setup import setup_causes

pytestmark = pytest.mark.dist


@pytest.mark.timeout(200)
def test_accelerate_dispatcher_is_named_and_host_syncs_not_measured_on_cpu(tmp_path):
    s = injected("accelerate_train.py", ["--steps", "100000", "--stream"], tmp_path, switches=["--steps", "12"])
    setup = s["injected"]["setup"]
    assert setup["one_rank_serves_data"] is True
    assert s["injected"]["measurements"]["host_syncs"] == NOT_ON_CPU and setup["host_syncs_per_step"] is None
    rows = {r["name"]: r for r in setup_causes(s, s["step_time_s"])}
    assert "dispatch_batches=False" in rows["one_rank_serves_data"]["advice"]
    assert "host_syncs" not in rows  # not counted: never claimed


def test_host_syncs_counted_on_a_gpu_are_a_cause():
    summary = {"injected": {"framework": {"name": "PyTorch"}, "ddp": [],
                            "setup": {"host_syncs_per_step": 3, "one_rank_serves_data": False}}}
    row = next(r for r in setup_causes(summary, 0.01) if r["name"] == "host_syncs")
    assert row["evidence"].startswith("3 host sync(s) per step") and ".item()" in row["advice"]
    assert row["seconds_per_step"] is None  # counted, not timed apart


def test_host_syncs_name_the_scripts_lines_and_blocking_copies_get_copy_advice():
    """Seen on an H200: a DDP tutorial script's `x, y = x.to(device), y.to(device)` from pageable memory, two syncs a
    step; the advice is about the copy, not about reading losses."""
    site = {"where": "ddp_train.py:83", "code": "x, y = x.to(device), y.to(device)", "per_step": 2.0}
    summary = {"injected": {"framework": {"name": "PyTorch"}, "ddp": [],
                            "setup": {"host_syncs_per_step": 2, "host_sync_sites": [site]}}}
    row = next(r for r in setup_causes(summary, 0.01) if r["name"] == "host_syncs")
    assert "ddp_train.py:83 `x, y = x.to(device), y.to(device)` (2/step)" in row["evidence"]
    assert "non_blocking=True" in row["advice"] and "pin_memory=True" in row["advice"]


def test_sync_warnings_are_counted_per_call_and_kept_from_the_user():
    counter, shown = SyncCounter(), []
    with warnings.catch_warnings():  # restores the filters and showwarning the counter replaces
        warnings.simplefilter("default")
        warnings.showwarning = lambda message, *rest: shown.append(str(message))  # where the user's warnings go
        counter.listen()
        for _ in range(3):  # one call site, three syncs: each counted (the default filter would show one)
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
        assert counter.take() == 3 and counter.take() == 0
    assert shown == ["something else"]
    (site,) = counter.top_sites(steps=3)  # the three came from one line of this file
    assert site["where"].startswith("test_setup_syncs.py:") and site["per_step"] == 1.0
    assert site["code"].startswith("warnings.warn(\"called a synchronizing")


@pytest.mark.parametrize("site,advice", [
    ({"function": "all_reduce", "where": "lit_cnn.py:27", "code": 'self.log("loss", loss, sync_dist=True)',
      "via": "lightning.pytorch.core.module.log"}, "on_epoch=True"),
    ({"function": "all_gather", "where": "hf_train.py:65", "code": "trainer.train()",
      "via": "accelerate.utils.operations._gpu_gather_one < accelerate.accelerator.gather < "
             "transformers.trainer.get_batch_samples < transformers.trainer._run_epoch"},
     "average_tokens_across_devices=False")])
def test_a_collective_every_step_that_a_setting_asks_for_is_named_with_the_setting(site, advice):
    summary = {"injected": {"framework": {"name": "x"}, "ddp": [], "setup": {}},
               "framework_collectives": {"calls_per_step": {site["function"]: 1.0}, "sites": [site]}}
    (row,) = [r for r in setup_causes(summary, 0.01) if r["name"] == "collective_every_step"]
    assert f"{site['function']} x1 a step from {site['where']}" in row["evidence"] and advice in row["advice"]
    rare = {**summary, "framework_collectives": {"calls_per_step": {site["function"]: 0.1}, "sites": [site]}}
    assert not [r for r in setup_causes(rare, 0.01) if r["name"] == "collective_every_step"]  # not every step
    other = {**summary, "framework_collectives": {"calls_per_step": {site["function"]: 1.0},
                                                  "sites": [{**site, "code": "x", "via": "lightning.loop.run"}]}}
    assert not [r for r in setup_causes(other, 0.01) if r["name"] == "collective_every_step"]  # nothing to change


def test_one_line_that_makes_two_collectives_is_one_row():
    site = {"where": "lit_cnn.py:26", "code": 'self.log("train_loss", loss, sync_dist=True)',
            "via": "lightning.fabric.utilities.distributed._sync_ddp"}
    summary = {"injected": {"framework": {"name": "Lightning Trainer"}, "ddp": [], "setup": {}},
               "framework_collectives": {"calls_per_step": {"barrier": 1.0, "all_reduce": 1.0},
                                         "sites": [{**site, "function": "barrier"}, {**site, "function": "all_reduce"}]}}
    (row,) = [r for r in setup_causes(summary, 0.01) if r["name"] == "collective_every_step"]
    assert row["evidence"].startswith("barrier x1 and all_reduce x1 a step from lit_cnn.py:26")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("script, args, exchanges", [
    ("ddp_train.py", ["--accum", "4"], 4),  # a first try: every micro-batch exchanged
    ("ddp_train.py", ["--accum", "4", "--no-sync"], 1),  # the fix: ddp_model.no_sync() on all but the last
    ("lightning_train.py", ["--accum", "4"], 1),  # Trainer(accumulate_grad_batches=4)
    pytest.param("accelerate_train.py", ["--accum", "4"], 1, marks=pytest.mark.full),  # accelerator.accumulate
    pytest.param("hf_train.py", ["--accum", "4"], 1, marks=pytest.mark.full)])  # gradient_accumulation_steps=4
def test_accumulation_that_exchanges_every_micro_batch_is_named_and_no_sync_is_not(tmp_path, script, args,
                                                                                   exchanges):
    """Gradients accumulated over 4 micro-batches make one iteration (one optimizer step); a first try exchanges
    on every micro-batch (Lightning#4092's cost), ``no_sync`` on all but the last and each framework's own
    accumulation exchange once."""
    s = injected(script, ["--steps", "100000", *args], tmp_path, switches=["--steps", "8"])
    setup = s["injected"]["setup"]
    assert (setup["micro_batches_per_step"], setup["exchanges_per_step"]) == (4, exchanges)
    rows = {r["name"]: r for r in setup_causes(s, s["step_time_s"])}
    if exchanges == 1:
        assert "exchange_every_micro_batch" not in rows
    else:
        row = rows["exchange_every_micro_batch"]
        assert row["evidence"].startswith("4 of 4 micro-batches") and "no_sync()" in row["advice"]


@pytest.mark.timeout(200)
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs sched_setaffinity and 2 cores to narrow")
def test_an_affinity_the_script_narrowed_is_named_and_advised_first(tmp_path):
    """A package that pins the process to one core at import (pytorch#82219): its loader workers and threads share
    that core while the others idle. The setup names it, and the CPU-contention and input advice start with it."""
    s = injected("ddp_train.py", ["--steps", "100000", "--pin-cpu"], tmp_path, switches=["--steps", "8"])
    setup = s["injected"]["setup"]
    assert (setup["cores"], setup["cores_at_start"]) == (1, len(os.sched_getaffinity(0)))
    row = {r["name"]: r for r in setup_causes(s, s["step_time_s"])}["cpu_affinity"]
    assert row["evidence"].startswith(f"each process may run on 1 core(s) of the {setup['cores_at_start']}")
    assert "os.sched_setaffinity(0, saved)" in row["advice"]
    ctx = script_context(s)
    contention = {"name": "cpu_contention", "who": {"cores": 2, "oversubscribed": True, "exchange_on_cpu": True}}
    assert script_advice(contention, ctx, 2) == row["advice"]  # not "fewer loader workers" for a core too few
    assert script_advice({"name": "input"}, ctx, 2).startswith(row["advice"])
    plain = injected("ddp_train.py", ["--steps", "100000"], tmp_path / "plain", switches=["--steps", "8"])
    assert "cpu_affinity" not in {r["name"] for r in setup_causes(plain, plain["step_time_s"])}
