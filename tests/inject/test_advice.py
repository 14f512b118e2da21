"""The doctor's report on a script as its user wrote it: evidence from the script's own DDP, advice in its own code.

A script that does not use trainscale's run API ignores trainscale's flags, so the report must name changes to
the script (DDP's ``bucket_cap_mb``, ``no_sync``, its ``DataLoader``, its threads) sized by what its run
recorded, and ``--apply`` must say it cannot make them. One short doctor run in the default tier; the rest are
pure tests of the advice on injected summaries.
"""

from __future__ import annotations

import re

import pytest
from inject_helpers import SCRIPTS

from clitools import read_json, run_cli
from trainscale.lab.advice.script import (
    cannot_apply,
    exchange_text,
    for_script,
    script_advice,
    script_context,
)
from trainscale.lab.advice.setup import setup_causes
from trainscale.lab.advice.suggest import suggest

# What only a run on trainscale's run API understands: never advice for a script that ignores it.
RUN_API_ONLY = re.compile(r"--strategy\.|--data\.|--job\.|--optim\.|--batch-size|TRAINSCALE_ARGS|trainscale launch")
FRAMEWORKS = ("PyTorch", "accelerate", "Lightning Fabric", "Lightning Trainer", "Hugging Face Trainer")
CAUSES = ("communication", "input", "sync_wait", "compute_interference", "framework_overhead", "threads",
          "straggler", "cpu_contention")


def _summary(framework: str = "PyTorch", cap_bytes: int = 10485, sizes: list[int] | None = None,
             overlap: float | None = 0.25) -> dict:
    """An injected run summary as ``trainscale.inject`` writes it, reduced to what the advice reads."""
    sizes = [40960, 9216, 1800] if sizes is None else sizes
    ddp = {"find_unused_parameters": False, "bucket_bytes": cap_bytes, "bucket_sizes_bytes": sizes,
           "gradient_bytes": sum(sizes), "overlap_frac": overlap, "comm_s": 0.0012 if overlap else None,
           "module": "ConvNet",
           "logging_data": {"bucket_cap_bytes": cap_bytes}}
    return {"batch_size": 32, "threads": 1, "device": "cpu", "bucket_mb": cap_bytes / 2**20,
            "allreduce_calls_per_step": len(sizes),
            "injected": {"framework": {"name": framework, "version": "x"}, "ddp": [ddp],
                         "setup": {"exchanges_per_step": 1, "micro_batches_per_step": 1, "loader_workers": 0,
                                   "threads": 1, "processes_per_node": 2, "cores": 2}}}


def test_the_exchange_is_named_from_the_scripts_own_ddp():
    text = exchange_text(_summary())
    assert "3 bucket(s)" in text and "bucket_cap_mb 0.01" in text and "51.98 KB" not in text
    assert "52.0 KB of gradients" in text and "all-reduces took 1.20 ms per backward, 25% of that overlapping" in text
    assert "None" not in text
    default = exchange_text(_summary(cap_bytes=25 * 2**20, sizes=[52000], overlap=None))
    assert "bucket_cap_mb 25, DDP's default" in default and "1 bucket(s)" in default
    assert "None" not in default and "overlap" not in default  # unknown: left out, never printed as None


def test_a_summary_without_ddp_figures_prints_no_none():
    s = _summary()
    s["injected"]["ddp"] = [{"find_unused_parameters": False, "bucket_bytes": None, "module": "M",
                             "logging_data": "not available in this PyTorch"}]
    s["allreduce_calls_per_step"] = None
    text = exchange_text(s)
    assert text == "DDP all-reduces the gradients" and "None" not in text


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_cause_is_advised_in_the_scripts_framework(framework):
    ctx = script_context(_summary(framework))
    for name in CAUSES:
        cause = {"name": name, "suggestion": "use --job.threads 2", "threads": 2, "rank": 1, "operator": "aten::mm",
                 "who": {"whose": "own", "cores": 2, "exchange_on_cpu": True, "oversubscribed": False}}
        text = script_advice(cause, ctx, 2)
        assert text and not RUN_API_ONLY.search(text), (name, text)
    comm = script_advice({"name": "communication"}, ctx, 2)
    assert "bucket_cap_mb=25" in comm and "now bucket_cap_mb 0.01: 3 buckets" in comm
    if framework == "Hugging Face Trainer":
        assert "TrainingArguments(ddp_bucket_cap_mb=25)" in comm
    if framework == "accelerate":
        assert "DistributedDataParallelKwargs(bucket_cap_mb=25)" in comm


def test_a_default_bucket_exchange_is_advised_to_happen_less_often():
    ctx = script_context(_summary(cap_bytes=25 * 2**20, sizes=[52000]))
    text = script_advice({"name": "communication"}, ctx, 2)
    assert "model.no_sync()" in text and "batch_size=64), now 32" in text and "latency-bound" in text
    lightning = script_context(_summary("Lightning Trainer", cap_bytes=25 * 2**20, sizes=[52000]))
    assert "Trainer(accumulate_grad_batches=2)" in script_advice({"name": "communication"}, lightning, 2)


def test_a_bucket_cap_below_ddps_default_is_a_setup_cause():
    row = next(r for r in setup_causes(_summary("Lightning Fabric"), 0.01) if r["name"] == "bucket_size")
    assert "bucket_cap_mb is 0.01" in row["evidence"] and "in 3 all-reduces per exchange" in row["evidence"]
    assert row["advice"].endswith("Fabric(strategy=DDPStrategy(bucket_cap_mb=25))")
    assert not setup_causes(_summary(cap_bytes=25 * 2**20, sizes=[40960, 9216]), 0.01)  # DDP's default: no cause


def test_input_advice_counts_the_scripts_own_workers():
    s = _summary()
    s["injected"]["setup"]["loader_workers"] = 3
    text = script_advice({"name": "input"}, script_context(s), 2)
    assert "num_workers=6" in text and "now 3 worker(s)" in text and "pin_memory" not in text  # a CPU job
    competes = script_advice({"name": "input", "loader_competes": True}, script_context(s), 2)
    assert "more loader workers would take more" in competes and not RUN_API_ONLY.search(competes)


def test_too_many_busy_threads_is_advised_on_the_knob_that_has_room():
    """1 intra-op thread and 2 loader workers per process, 2 processes on 2 cores (found on an untuned script): the
    change is fewer workers, not threads set to the 1 they already are; several threads: fewer threads."""
    s = _summary()
    s["injected"]["setup"].update(threads=1, loader_workers=2, processes_per_node=2, cores=2)
    row = next(r for r in setup_causes(s, 0.01) if r["name"] == "threads")
    assert "num_workers=0" in row["advice"] and "now 2" in row["advice"] and "set_num_threads" not in row["advice"]
    contention = {"name": "cpu_contention", "who": {"oversubscribed": True, "cores": 2, "whose": "own"}}
    assert "num_workers=0" in script_advice(contention, script_context(s), 2)
    s["injected"]["setup"].update(threads=4, loader_workers=0)
    assert "torch.set_num_threads(1)" in script_advice(contention, script_context(s), 2)


def test_for_script_rewrites_every_suggestion_and_leaves_nothing_to_apply():
    ctx = script_context(_summary())
    res = {"nproc": 2, "causes": [{"name": n, "suggestion": suggest(n, {"rank": 0, "threads": 1})[0],
                                   "apply_flags": {"job.threads": "1"}, "threads": 1, "significant": n == "input",
                                   "seconds_per_step": 0.001, "verdict": "clear", "evidence": "e"}
                                  for n in CAUSES],
           "bottleneck": {"name": "compute", "shares": {"compute": 0.7}, "advice": "--strategy.amp bf16",
                          "apply_flags": {"strategy.amp": "bf16"}}, "what_if": [], "step_time_n_s": 0.01}
    for_script(res, ctx)
    texts = [c["suggestion"] for c in res["causes"]] + [res["bottleneck"]["advice"]]
    assert all(not RUN_API_ONLY.search(t) for t in texts), texts
    assert all(c["apply_flags"] == {} for c in res["causes"]) and res["bottleneck"]["apply_flags"] == {}
    assert [w["suggestion"] for w in res["what_if"]] == [script_advice(res["causes"][5], ctx, 2)]
    line = cannot_apply(res, ["train.py"])["text"]
    assert line.startswith("--apply cannot change a script trainscale did not write (train.py)")
    assert "num_workers=2" in line and "\n" not in line


def test_the_run_apis_advice_keeps_its_flags():
    ctx = {"bucket_mb": 1.0, "calls": 12, "strategy_fields": ["bucket_mb"], "data_fields": ["workers"]}
    assert suggest("communication", ctx)[1] == {"strategy.bucket_mb": "25"}
    assert suggest("input", {"workers": 1, "data_fields": ["workers"]})[1] == {"data.workers": "2"}


def _advice_lines(doc: dict) -> list[str]:
    """Every piece of advice a doctor.json holds."""
    lines = [c["suggestion"] for c in doc["causes"]] + [w["suggestion"] for w in doc.get("what_if") or []]
    lines += [doc["bottleneck"].get("advice") or "", (doc.get("apply") or {}).get("text") or ""]
    return lines + [c["advice"] for c in doc["injected"]["setup_causes"]]


@pytest.mark.dist
@pytest.mark.timeout(420)
def test_doctor_on_an_untuned_script_speaks_of_its_own_code(tmp_path):
    out = tmp_path / "doc"
    r = run_cli(["doctor", "--nproc", "2", "--repeat", "2", "--quick", "--cycles", "4", "--phase-steps", "6",
                 "--apply", "--out", str(out), "--", "torchrun", "--nproc-per-node", "2",
                 str(SCRIPTS / "untuned_conv.py"), "--steps", "100000", "--bucket-cap-mb", "0.01"], timeout=400)
    assert r.rc == 0, r.err[-3000:]
    doc = read_json(out / "doctor.json")
    ddp = read_json(next((out / "runs").glob("phases_n2_*.json")))["injected"]["ddp"][0]
    buckets = len(ddp["bucket_sizes_bytes"])
    assert buckets > 1  # the script's 0.01 MB cap splits its 52 KB of gradients
    comm = next(c for c in doc["causes"] if c["name"] == "communication")
    assert f"in {buckets} bucket(s) (bucket_cap_mb 0.01)" in comm["evidence"] and "None" not in comm["evidence"]
    assert "DistributedDataParallel(model, bucket_cap_mb=25)" in comm["suggestion"]
    setup = {c["name"]: c for c in doc["injected"]["setup_causes"]}
    assert "bucket_cap_mb is 0.01" in setup["bucket_size"]["evidence"]
    bad = [t for t in _advice_lines(doc) if RUN_API_ONLY.search(t)]
    assert bad == []
    first_screen = (out / "doctor.md").read_text().split("## How to read this")[0]
    assert not RUN_API_ONLY.search(first_screen), RUN_API_ONLY.findall(first_screen)
    assert doc["apply"]["text"].startswith("--apply cannot change a script trainscale did not write")
    assert not list((out / "runs").glob("applied_*"))  # nothing tried with flags the script would ignore
