"""The instruments: only the active ones are built and called, in one order; each rank's figures are named."""

from __future__ import annotations

import math

import torch
from torch import nn

from trainscale.config import Config, apply_overrides
from trainscale.train.instruments import ComputeClock, Instruments, RankStats, SlowRank, StepMode, StepTimeline


def build(tmp_path, **overrides) -> Instruments:
    cfg = apply_overrides(Config(), {"log.skip_first": 1, **overrides})
    return Instruments(cfg, 0, True, torch.device("cpu"), nn.Linear(2, 1), tmp_path)


def steps(ins: Instruments, n: int, first: int = 1) -> None:
    model = nn.Linear(2, 1)
    for step in range(first, first + n):
        ins.forward_starts()
        loss = model(torch.randn(4, 2)).sum()
        ins.watch(loss)
        loss.backward()
        ins.step_called()
        ins.optimizer_starts()
        ins.step_done(step, StepMode())


def test_only_the_instruments_asked_for_are_active(tmp_path):
    assert [type(i).__name__ for i in build(tmp_path).active] == ["ComputeClock", "StepTimes"]
    ins = build(tmp_path, **{"log.timeline": True, "job.slow_rank": 0, "job.slow_factor": 2.0})
    assert [type(i) for i in ins.active][:3] == [SlowRank, ComputeClock, StepTimeline]


def test_a_switched_off_instrument_is_not_called_and_the_others_go_on(tmp_path):
    ins = build(tmp_path, **{"log.timeline": True})
    steps(ins, 3)  # the first is the warm-up
    assert ins.timeline is not None and len(ins.timeline.rows) == 2 and len(ins.step_times) == 2
    ins.switch(ins.timeline, False)
    steps(ins, 2, first=4)
    assert len(ins.timeline.rows) == 2 and len(ins.step_times) == 4
    ins.switch(ins.timeline, True)
    steps(ins, 1, first=6)
    assert len(ins.timeline.rows) == 3


def test_each_ranks_figures_come_as_a_named_record(tmp_path):
    ins = build(tmp_path)
    steps(ins, 4)
    ins.end_steps()
    ins.finish(1)
    stats = ins.local_stats()
    assert isinstance(stats, RankStats)
    assert stats.step_time_s > 0 and stats.compute_s > 0 and stats.cpu_s > 0 and math.isfinite(stats.compute_spread)
    assert stats.phases == {} and stats.accounting is None and ins.summary() == {}
