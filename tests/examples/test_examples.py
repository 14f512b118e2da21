"""Every script in examples/ runs at 2 processes with the command examples/README.md gives, and does what it shows:
the resumed run's weights equal the uninterrupted run's, clipping engages, accumulation steps the optimizer and
the learning rate once per N micro-batches, local SGD exchanges less and ZeRO keeps less, the pipeline learns."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clitools import REPO, Result, read_json, run_cli

EXAMPLES = REPO / "examples"
QUIET = ["--log.progress", "none"]  # run configuration: every example passes --section.field VALUE to the run
pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]


def launch(script: str, *args: str, summary: Path | None = None) -> Result:
    """``trainscale launch --nproc-per-node 2 examples/SCRIPT ARGS``, as examples/README.md says; exit 0."""
    env = {"TRAINSCALE_JSON": str(summary)} if summary else None  # where the run writes its summary
    r = run_cli(["launch", "--nproc-per-node", "2", f"examples/{script}", *args, *QUIET], timeout=200, env=env)
    assert r.rc == 0, r.text[-3000:]
    return r


def number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in the output:\n{text[-2000:]}"
    return float(m.group(1))


def test_classify_digits(tmp_path):
    r = launch("classify_digits.py", "--steps", "40", summary=tmp_path / "s.json")
    s = read_json(tmp_path / "s.json")
    assert s["world_size"] == 2 and s["steps"] == 40 and s["loss_last"] < s["loss_first"]
    assert number(r"test accuracy ([\d.]+) on 297 digits", r.out) > 0.5  # chance: 0.1


@pytest.mark.full  # a language model learning: test_gpt_learns_and_reports_its_flops_and_mfu
def test_char_lm(tmp_path):
    r = launch("char_lm.py", "--steps", "40")
    first, last, uniform = (number(p, r.out) for p in (r"loss ([\d.]+) ->", r"-> ([\d.]+) \(", r"guess: ([\d.]+)"))
    assert last < first and last < uniform  # it learned something about the text


@pytest.mark.full  # resumes are checked bit for bit in tests/test_resume_eval.py and tests/survive
def test_checkpointing_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path):
    whole, resumed = tmp_path / "ck", tmp_path / "ck2"
    launch("by_feature/checkpointing.py", "--steps", "20", "--save-every", "10", "--out", str(whole))
    r = launch("by_feature/checkpointing.py", "--steps", "20", "--save-every", "10", "--out", str(resumed),
               "--resume", str(whole / "step_10.pt"), summary=tmp_path / "s.json")
    assert read_json(tmp_path / "s.json")["resumed_from_step"] == 10 and "steps 11..20" in r.out
    assert not (resumed / "step_10.pt").exists()  # the second launch did not redo the first 10 steps
    want, got = (torch.load(d / "step_20.pt", weights_only=True) for d in (whole, resumed))
    ten = torch.load(whole / "step_10.pt", weights_only=True)
    for k in want["model"]:
        assert torch.equal(got["model"][k], want["model"][k]), k
    assert any(not torch.equal(ten["model"][k], want["model"][k]) for k in want["model"])  # steps 11..20 trained
    momentum = [s["momentum_buffer"] for s in want["optimizer"]["state"].values()]
    assert all(torch.equal(a, s["momentum_buffer"]) for a, s in zip(momentum, got["optimizer"]["state"].values()))


@pytest.mark.full
def test_amp_clipping_reports_the_norm_and_clips(tmp_path):
    r = launch("by_feature/amp_clipping.py", "--max-norm", "0.3", summary=tmp_path / "s.json")
    s = read_json(tmp_path / "s.json")
    assert s["amp"] == ("fp16" if torch.cuda.is_available() else "bf16")
    assert number(r"([\d.]+) max;", r.out) > 0.3  # the norm before clipping, reported
    clipped, steps = number(r"on (\d+) of", r.out), number(r"of (\d+) steps", r.out)
    assert steps == 30 and 1 <= clipped <= steps
    assert s["loss_last"] < s["loss_first"]


@pytest.mark.full
def test_gradient_accumulation_steps_the_optimizer_and_lr_once_per_accumulation(tmp_path):
    r = launch("by_feature/gradient_accumulation.py", "--strategy.grad_accum", "4", summary=tmp_path / "s.json")
    s = read_json(tmp_path / "s.json")
    assert (s["steps"], s["grad_accum"], s["global_batch"]) == (20, 4, 16 * 2 * 4)
    assert "20 optimizer steps from 80 micro-batches (grad_accum 4)" in r.out
    lrs = [float(v) for v in re.search(r"per optimizer step: ([\d. ]+)", r.out).group(1).split()]
    assert len(lrs) == 20  # one learning rate per optimizer step, not per micro-batch
    assert lrs[:5] == sorted(lrs[:5]) and lrs[4] == pytest.approx(0.1)  # the warm-up to the peak ...
    assert lrs[5:] == sorted(lrs[5:], reverse=True) and lrs[-1] < 0.01  # ... then the decay
    assert s["loss_last"] < s["loss_first"]


@pytest.mark.full
def test_local_sgd_exchanges_less_and_zero_keeps_less_state(tmp_path):
    launch("by_feature/local_sgd_zero.py", "--strategy.local_sgd_period", "4", summary=tmp_path / "local.json")
    launch("by_feature/local_sgd_zero.py", "--strategy.shard_optimizer", "true", summary=tmp_path / "zero.json")
    local, zero = read_json(tmp_path / "local.json"), read_json(tmp_path / "zero.json")
    # ZeRO exchanges the gradients every step as DDP does; local SGD averages the parameters every 4th step.
    assert local["comm_bytes_per_step"] < 0.35 * zero["comm_bytes_per_step"]
    assert local["replica_max_diff"] > 0  # the replicas trained apart between averages
    # Adam's state, whole on every local-SGD process, is split between the two ZeRO processes.
    assert zero["optim_state_bytes"] < 0.7 * local["optim_state_bytes"]
    for s in (local, zero):
        assert s["eval_accuracy"] > 0.7 and s["loss_last"] < s["loss_first"]


@pytest.mark.full  # the pipeline's training: tests/pipeline/test_pipeline_parity.py
def test_pipeline_trains_through_forward_backward(tmp_path):
    r = launch("by_feature/pipeline.py", "--steps", "20", summary=tmp_path / "s.json")
    s = read_json(tmp_path / "s.json")
    pipe = s["pipeline"]
    assert (pipe["stages"], pipe["replicas"]) == (2, 1) and all(pipe["chunk_layers"])
    assert s["loss_last"] < s["loss_first"] and "2 stages" in r.out


def test_gpt_learns_and_reports_its_flops_and_mfu(tmp_path):
    size = ["--layers", "2", "--width", "64", "--block", "32", "--batch-size", "8", "--accum", "2"]
    r = launch("gpt.py", "--steps", "30", "--chars", "40000", "--eval-batches", "4", "--sample", "40", *size,
               "--log.skip_first", "2", summary=tmp_path / "s.json")
    before, after = number(r"validation loss ([\d.]+) ->", r.out), number(r"-> ([\d.]+) in 30 steps", r.out)
    assert after < before - 0.5, r.out[-2000:]  # uniform guess: ln(36) = 3.58; the grammar is learnable
    assert "sample: " in r.out
    s = read_json(tmp_path / "s.json")
    # 6 N + 12 L d T model FLOPs per token, N without the position embedding; tokens: 2 ranks x 2 x 8 x 32.
    gpt = runpy.run_path(str(EXAMPLES / "gpt.py"), run_name="gpt_example")
    vocab = len(set(gpt["make_text"](40000, 0) + gpt["make_text"](4000, 1)))
    model = gpt["GPT"](vocab, 32, 2, 4, 64)
    n = sum(p.numel() for p in model.parameters()) - model.pos.weight.numel()
    tokens = 2 * 2 * 8 * 32
    assert s["flops_per_step"] == pytest.approx(6 * n * tokens + 12 * 2 * 64 * 32 * tokens, rel=0.02)
    assert 0 < s["mfu"] == pytest.approx(s["flops_per_s"] / s["peak_flops"])
    precision = {"none": "fp32"}.get(gpt["default_amp"](), gpt["default_amp"]())  # bf16 only where it is native
    assert s["amp"] == gpt["default_amp"]() and s["peak_flops_source"].startswith(f"measured: {precision}")
    rows = [json.loads(line) for line in Path(s["metrics_jsonl"]).read_text().splitlines()]
    assert rows and all(row["mfu"] > 0 for row in rows)  # MFU at every log point


@pytest.mark.full
@pytest.mark.timeout(120)
def test_gpt_compile_without_a_working_compiler_is_one_line(tmp_path):
    # No C++ compiler for inductor's CPU backend: the trial compile fails before any process group starts.
    env = {**os.environ, "CXX": str(tmp_path / "no-such-g++"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    r = subprocess.run([sys.executable, str(EXAMPLES / "gpt.py"), "--compile", "--steps", "1"], capture_output=True,
                       text=True, timeout=100, env=env, cwd=REPO)
    assert r.returncode == 2 and r.stdout == "", r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "torch.compile does not work here" in r.stderr


TESTED = {  # each script in examples/ and the test that runs it
    "classify_digits.py": test_classify_digits,
    "char_lm.py": test_char_lm,
    "gpt.py": test_gpt_learns_and_reports_its_flops_and_mfu,
    "by_feature/checkpointing.py": test_checkpointing_resumes_to_the_weights_of_an_uninterrupted_run,
    "by_feature/amp_clipping.py": test_amp_clipping_reports_the_norm_and_clips,
    "by_feature/gradient_accumulation.py": test_gradient_accumulation_steps_the_optimizer_and_lr_once_per_accumulation,
    "by_feature/local_sgd_zero.py": test_local_sgd_exchanges_less_and_zero_keeps_less_state,
    "by_feature/pipeline.py": test_pipeline_trains_through_forward_backward,
}


@pytest.mark.timeout(30)
def test_every_example_has_a_test_a_readme_line_and_its_command():
    scripts = sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.py"))
    assert scripts == sorted(TESTED), "a script in examples/ without a test here (or a test of a missing script)"
    readme = (EXAMPLES / "README.md").read_text()
    for name in scripts:
        text = (EXAMPLES / name).read_text()
        command = f"trainscale launch --nproc-per-node 2 examples/{name}"
        assert f"]({name})" in readme and command in readme, f"examples/README.md has no line for {name}"
        assert command in text, f"{name}: its docstring does not say how to run it"
        if name.startswith("by_feature/"):
            assert "# NEW" in text, f"{name}: no line marked # NEW (the feature, against the base example)"
