"""The summary builder on its own: what the run's parts measured becomes a summary that the schema accepts."""

from __future__ import annotations

import math
import time

import jsonschema
import pytest
import torch
from run_fakes import context, one_rank_group, parts
from torch import nn

from trainscale.train.instruments import StepMode
from trainscale.train.report.summary_builder import RunRecord, build_summary
from trainscale.train.summary import strict_json, summary_schema

env = pytest.fixture(one_rank_group)


class Batches:
    """A loader as the summary reads it."""

    batch_size, samples_per_s, skipped = 4, 1000.0, 3


def measured_parts(env, tmp_path, steps: int):
    """A context and parts whose instruments and loss window went through ``steps`` steps of 2 ms each."""
    ctx = context(env, tmp_path)
    module = nn.Linear(2, 1)
    p = parts(ctx, module, torch.optim.SGD(module.parameters(), lr=0.1))
    ins, losses = p.instruments, ctx.meters.losses
    losses.start()
    ins.loop_starts(losses.t_loop)
    for step in range(1, steps + 1):
        ins.forward_starts()
        time.sleep(0.002)
        losses.add(torch.tensor(float(10 - step)))
        ins.step_called()
        ins.step_done(step, StepMode())
        losses.step_done(step, step == steps, lambda t: t)
    ins.end_steps()
    ins.finish(env.world_size)
    return ctx, p


def record(ctx, steps: int, **kw) -> RunRecord:
    return RunRecord(steps=steps, start_step=0, global_batch=4, shards=1, started_at="2026-11-28T07:00:00+00:00",
                     restarts=0, steps_redone=0, preempted=False, eval_result=(0.5, 0.75, 20), out_dir=ctx.out_dir,
                     losses=ctx.meters.losses, loader=Batches(), extra={"model_name": "tiny"}, **kw)


@pytest.mark.timeout(60)
def test_the_summary_holds_what_was_measured_and_validates(env, tmp_path):
    steps = 6
    ctx, p = measured_parts(env, tmp_path, steps)
    out = build_summary(ctx.cfg, ctx.env, p, record(ctx, steps))

    jsonschema.validate(strict_json(out), summary_schema())
    warm = ctx.cfg.log.skip_first
    assert out["steps"] == steps and out["measured_steps"] == steps - warm
    assert out["samples_per_s"] == pytest.approx((steps - warm) * 4 / sum(p.instruments.step_times))
    assert 0.002 <= out["step_time_s"] < 1.0 and math.isfinite(out["step_time_spread"])
    assert (out["loss_first"], out["loss_last"]) == (9.0, 10.0 - steps)
    assert (out["eval_loss"], out["eval_accuracy"], out["eval_samples"]) == (0.5, 0.75, 20)
    assert (out["batch_size"], out["data_samples_per_s"], out["data_skipped"]) == (4, 1000.0, 3)
    assert out["world_size"] == 1 and out["model"] == "Linear" and out["allreduce_calls_per_step"] == 0
    assert len(out["rank_compute_s"]) == len(out["rank_step_time_s"]) == len(out["rank_cpu_s"]) == 1
    assert out["rank_step_time_s"][0] == out["step_time_s"] and out["compute_s"] == out["rank_compute_s"][0]
    assert out["model_name"] == "tiny" and out["stragglers"] == [] and out["phases"] is None


@pytest.mark.timeout(60)
def test_flops_give_mfu_against_the_peak(env, tmp_path):
    ctx, p = measured_parts(env, tmp_path, 4)
    out = build_summary(ctx.cfg, ctx.env, p, record(ctx, 4, flops=(2e9, 1e12), peak_source="catalog: test"))
    assert out["flops_per_step"] == 2e9 and out["peak_flops"] == 1e12
    assert out["mfu"] == pytest.approx(2e9 / out["step_time_s"] / 1e12)
    assert out["peak_flops_source"] == "catalog: test"
