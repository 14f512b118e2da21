"""The stepper on its own: accumulation, the optimizer step and clipping give a plain PyTorch loop's weights."""

from __future__ import annotations

import pytest
import torch
from run_fakes import context, one_rank_group, parts
from torch import nn

from trainscale.config import Config, apply_overrides
from trainscale.train.errors import RunError
from trainscale.train.feed.batches import Feed
from trainscale.train.stepper import Stepper

env = pytest.fixture(one_rank_group)


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def data(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(3, 4, generator=g), torch.randn(3, 1, generator=g)) for _ in range(n)]


def stepper(env, tmp_path, accum: int = 1, optimizer: bool = True) -> tuple[Stepper, nn.Module]:
    ctx = context(env, tmp_path, apply_overrides(Config(), {"strategy.grad_accum": accum}))
    module = net()
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9) if optimizer else None
    return Stepper(ctx, parts(ctx, module, opt), Feed(ctx)), module


def reference(batches, accum: int, clip: float | None = None) -> list[torch.Tensor]:
    """nanoGPT's loop: the loss divided by the micro-batches, one optimizer step per ``accum`` of them."""
    module = net()
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    for i, (x, y) in enumerate(batches):
        (nn.functional.mse_loss(module(x), y) / accum).backward()
        if (i + 1) % accum == 0:
            if clip is not None:
                nn.utils.clip_grad_norm_(module.parameters(), clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return [p.detach() for p in module.parameters()]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("accum", [1, 3])
def test_steps_give_a_plain_loops_weights(env, tmp_path, accum):
    batches = data(3 * accum)
    st, module = stepper(env, tmp_path, accum)
    taken = []
    for x, y in batches:
        st.backward(nn.functional.mse_loss(st.model(x), y))
        taken.append(st.step())
    assert taken == ([False] * (accum - 1) + [True]) * 3
    assert st.state.step_count == 3 and st.state.micro == 0
    assert all(p.grad is None for p in module.parameters())  # zero_grad after every optimizer step
    for mine, ref in zip(module.parameters(), reference(batches, accum)):
        torch.testing.assert_close(mine.detach(), ref, rtol=0, atol=0)


@pytest.mark.timeout(60)
def test_clip_waits_for_the_last_micro_batch_then_clips_like_torch(env, tmp_path):
    batches = data(4)
    st, module = stepper(env, tmp_path, accum=2)
    norms = []
    for x, y in batches:
        st.backward(nn.functional.mse_loss(st.model(x), y))
        norms.append(st.clip_gradients(0.05, 2.0))
        st.step()
    assert norms[0] is None and norms[2] is None and norms[1] is not None and norms[3] is not None
    for mine, ref in zip(module.parameters(), reference(batches, 2, clip=0.05)):
        torch.testing.assert_close(mine.detach(), ref)


@pytest.mark.timeout(60)
def test_misuse_is_one_clear_error(env, tmp_path):
    st, _ = stepper(env, tmp_path, optimizer=False)
    x, y = data(1)[0]
    with pytest.raises(RunError, match=r"the loss must be a scalar tensor, got \(3, 1\)"):
        st.backward((st.model(x) - y) ** 2)
    st.backward(nn.functional.mse_loss(st.model(x), y))
    with pytest.raises(RunError, match="needs the optimizer"):
        st.step()
