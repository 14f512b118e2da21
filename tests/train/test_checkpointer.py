"""The checkpointer on its own: cadence, the ``latest`` pointer, pruning, and a load that restores what was saved."""

from __future__ import annotations

import pytest
import torch
from run_fakes import PlainStrategy, RecordingGuard, context, one_rank_group
from torch import nn

from trainscale.config import Config, apply_overrides
from trainscale.train.checkpoint.checkpointer import Checkpointer
from trainscale.train.checkpoint.files import read_latest

env = pytest.fixture(one_rank_group)


def build(env, tmp_path, **ck):
    cfg = apply_overrides(Config(), {f"checkpoint.{k}": v for k, v in ck.items()})
    ctx = context(env, tmp_path, cfg, RecordingGuard())
    torch.manual_seed(0)
    module = nn.Linear(3, 2)
    opt = torch.optim.AdamW(module.parameters(), lr=0.1)
    module(torch.randn(4, 3)).sum().backward()
    opt.step()  # optimizer state to save
    st = PlainStrategy(module)
    return Checkpointer(ctx, st, opt, []), ctx, st, module, opt


@pytest.mark.timeout(60)
def test_cadence_and_names_follow_the_checkpoint_section(env, tmp_path):
    ck, *_ = build(env, tmp_path, dir=str(tmp_path / "ck"), every=3, format="file")
    assert [s for s in range(1, 10) if ck.should_save(s)] == [3, 6, 9]
    assert ck.path_for(3) == tmp_path / "ck" / "step_3.pt"
    assert ck.path_for(9, final=True) == tmp_path / "ck" / "last.pt"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", ["file", "dcp"])
def test_latest_names_the_newest_checkpoint_and_keep_prunes_older_ones(env, tmp_path, fmt):
    folder = tmp_path / "ck"
    ck, *_ = build(env, tmp_path, dir=str(folder), every=1, keep=2, format=fmt)
    for step in (1, 2, 3):
        ck.save_periodic(step)
    ck.wait()
    newest = ck.path_for(3).name
    assert read_latest(folder) == newest
    assert sorted(p.name for p in folder.glob("step_*")) == sorted([ck.path_for(2).name, newest])


@pytest.mark.timeout(60)
def test_an_asynchronous_checkpoint_is_published_once_complete(env, tmp_path):
    folder = tmp_path / "ck"
    ck, *_ = build(env, tmp_path, dir=str(folder), format="dcp", async_save=True)
    ck.save(folder / "step_1", 1)
    ck.wait()
    assert read_latest(folder) == "step_1"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["step_4.pt", "step_4"])
def test_load_restores_model_optimizer_and_counters(env, tmp_path, name):
    folder = tmp_path / "ck"
    ck, ctx, st, module, opt = build(env, tmp_path)
    st.steps = 4
    ck.save(folder / name, 4, extra={"note": "kept"})
    weights = [p.detach().clone() for p in module.parameters()]
    moments = [s["exp_avg"].clone() for s in opt.state.values()]
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)
    for s in opt.state.values():
        s["exp_avg"].zero_()
    st.steps = 0

    state = ck.load(folder)  # the folder: the newest readable checkpoint in it

    assert int(state["step"]) == 4 and st.steps == 4 and ctx.guard.resumed_at == 4
    assert all(torch.equal(a, b) for a, b in zip(module.parameters(), weights))
    assert all(torch.equal(s["exp_avg"], m) for s, m in zip(opt.state.values(), moments))


@pytest.mark.timeout(60)
def test_a_folder_without_checkpoints_loads_nothing(env, tmp_path):
    ck, *_ = build(env, tmp_path)
    assert ck.load(tmp_path / "none_yet") == {}
