"""Mixed precision as PyTorch's recipe: the loss under autocast in the run's loop, nothing cast back, no state left
behind; and the log point's figures, read one window later from host memory, are the loop's own losses.

One process, in this one: the run API at world size 1 (a one-rank Gloo group).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trainscale

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
QUIET = ["--log.progress", "none", "--job.heartbeat_s", "0", "--log.stragglers", "false"]
pytestmark = pytest.mark.timeout(120)


def model_and_batches(n: int = 4) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 512))  # a wide output, as logits are
    g = torch.Generator().manual_seed(1)
    return model, [(torch.randn(8, 16, generator=g), torch.randint(512, (8,), generator=g)) for _ in range(n)]


def plain_amp_losses(model: nn.Module, batches: list, loss_fn: Callable, device: torch.device,
                     amp: str) -> list[torch.Tensor]:
    """PyTorch's AMP recipe by hand: autocast around the forward and the loss, backward outside (fp16: with the
    loss scaler), SGD."""
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    losses = []
    for x, y in batches:
        with torch.autocast(device.type, dtype=DTYPES[amp]):
            loss = loss_fn(model(x.to(device)), y.to(device))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return losses


def start(model: nn.Module, *args: str, amp: str = "bf16") -> tuple[trainscale.Run, nn.Module]:
    """A run under ``amp`` on a copy of ``model``, with the plain loop's SGD."""
    device = "cuda" if amp == "fp16" and torch.cuda.is_available() else "cpu"  # fp16 on a GPU where one is
    run = trainscale.init(args=[*QUIET, "--job.device", device, "--strategy.amp", amp, *args])
    model = copy.deepcopy(model)
    prepared, _, _ = run.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return run, prepared


def feed(batches: list) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """The batches in order, as a batch function (nanoGPT's get_batch)."""
    it = itertools.cycle(batches)
    return lambda: next(it)


def on(device: str = "cpu") -> bool:
    return torch.is_autocast_enabled(device)


LOSSES = {"cross_entropy": F.cross_entropy, "nll_loss": F.nll_loss,
          "mse_loss": lambda out, y: F.mse_loss(out, F.one_hot(y, 512).to(out.dtype))}


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
@pytest.mark.parametrize("loss", list(LOSSES))
def test_the_readme_loop_computes_the_plain_amp_recipes_loss(loss, amp):
    model, batches = model_and_batches()
    run, prepared = start(model, amp=amp)
    dev = run.device
    want = plain_amp_losses(model, batches, LOSSES[loss], dev, amp)
    got, dtypes = [], []
    try:
        for x, y in run.batches(feed(batches), steps=len(batches)):
            out = prepared(x)
            assert out.dtype == DTYPES[amp] and on(dev.type)  # as autocast made it; the region is open for the loss
            loss_value = LOSSES[loss](out, y)
            run.backward(loss_value)
            assert not on(dev.type)  # backward ran outside autocast
            run.step()
            got.append(loss_value.detach())
            dtypes.append(loss_value.dtype)
    finally:
        run.finish()
    assert not on(dev.type)
    assert dtypes == [w.dtype for w in want] == [torch.float32] * len(want)  # on autocast's float32 list
    torch.testing.assert_close(torch.stack(got), torch.stack(want), rtol=1e-6, atol=0)


def test_forward_backward_and_evaluate_follow_the_same_rule():
    model, batches = model_and_batches()
    want = plain_amp_losses(model, batches, F.cross_entropy, torch.device("cpu"), "bf16")
    run, prepared = start(model)
    got = []
    try:
        for x, y in run.batches(feed(batches), steps=len(batches)):
            got.append(run.forward_backward(x, y, F.cross_entropy).detach())
            assert not on()
            run.step()
        ev = run.evaluate(None, F.cross_entropy, batches=batches[:1])
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            plain_eval = F.cross_entropy(prepared.module(batches[0][0]), batches[0][1])
    finally:
        run.finish()
    assert torch.equal(torch.stack(got), torch.stack(want))
    assert ev["loss"] == pytest.approx(plain_eval.item(), rel=1e-6)
    assert not on()


def test_a_loss_computed_inside_no_sync_still_runs_under_autocast():
    """``out = model(x)``, then the loss inside ``run.no_sync()``: no_sync is no seam of the loss."""
    model, batches = model_and_batches(2)
    run, prepared = start(model)
    try:
        for x, y in run.batches(feed(batches), steps=2):
            out = prepared(x)
            with run.no_sync():
                loss = F.cross_entropy(out, y)
                assert on() and loss.dtype == torch.float32
            run.backward(loss)
            run.step()
    finally:
        run.finish()
    assert not on()


def test_amp_cast_outputs_is_the_opt_in_cast_back_to_float32():
    model, batches = model_and_batches(2)
    run, prepared = start(model, "--strategy.amp_cast_outputs", "true")
    try:
        for x, y in run.batches(feed(batches), steps=2):
            out = prepared(x)
            assert out.dtype == torch.float32 and not on()  # the region ended with the forward
            run.backward(F.cross_entropy(out, y))
            run.step()
    finally:
        run.finish()


def test_no_autocast_state_is_left_behind_by_eval_or_a_users_own_region():
    model, batches = model_and_batches(2)
    run, prepared = start(model)
    try:
        (x, y), (x2, y2) = batches
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the user's own region: it decides, as without us
            out = prepared(x)
        assert not on()
        run.backward(F.cross_entropy(out.float(), y))
        run.step()
        out = prepared(x2)  # the run's region opens, then the user opens one of their own around backward
        with torch.autocast("cpu", dtype=torch.bfloat16):
            run.backward(F.cross_entropy(out, y2))  # ours cannot end inside theirs: it ends at the next call
        assert on()
        run.step()
        assert not on()
        prepared.eval()
        with torch.no_grad():
            assert prepared(x).dtype == torch.bfloat16 and on()
        prepared.train()
        assert not on()
    finally:
        run.finish()
    assert not on()


def test_log_points_show_the_loops_own_losses_one_window_later_without_a_sync(tmp_path, capfd):
    model, batches = model_and_batches(7)
    run = trainscale.init(args=["--job.heartbeat_s", "0", "--log.stragglers", "false", "--log.progress", "lines",
                                "--job.device", "cpu",
                                "--log.every", "2", "--job.out", str(tmp_path)])
    model = copy.deepcopy(model)
    prepared, _, _ = run.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    losses, rows_seen = [], []
    metrics = tmp_path / "metrics.jsonl"
    try:
        for x, y in run.batches(feed(batches), steps=7):
            loss = F.cross_entropy(prepared(x), y)
            run.backward(loss)
            run.step()
            losses.append(loss.item())
            rows_seen.append(len(metrics.read_text().splitlines()) if metrics.exists() else 0)
        summary = run.finish()
    finally:
        run.finish()
    # Each log point's row is written at the next one (its loss read from the host copy by then); the last at once.
    assert rows_seen == [0, 0, 0, 1, 1, 2, 4]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    windows = {2: losses[0:2], 4: losses[2:4], 6: losses[4:6], 7: losses[6:7]}
    assert [r["step"] for r in rows] == list(windows) == [p[0] for p in summary["loss_curve"]]
    for row, window, point in zip(rows, windows.values(), summary["loss_curve"]):
        assert row["loss"] == pytest.approx(sum(window) / len(window), rel=1e-6) == point[2]
        assert row["samples_per_s"] > 0 and row["step_time_s"] > 0 and row["data_wait_s"] >= 0
    shown = re.findall(r"step (\d+)/7\s+loss (\S+)", capfd.readouterr().err)
    assert [(int(s), float(v)) for s, v in shown] == [(r["step"], round(r["loss"], 4)) for r in rows]


def test_a_model_compiled_after_prepare_keeps_its_precision_through_the_cast():
    """torch.compile of the prepared model cannot keep a region open past its graph: the forward's region ends
    with it and the outputs come back in float32, as before (compile the model before ``run.prepare`` instead)."""
    model, batches = model_and_batches(2)
    want = plain_amp_losses(model, batches, F.cross_entropy, torch.device("cpu"), "bf16")
    run, prepared = start(model)
    compiled = torch.compile(prepared, backend="eager")
    got = []
    try:
        for x, y in run.batches(feed(batches), steps=2):
            out = compiled(x)
            assert out.dtype == torch.float32 and not on()
            got.append(F.cross_entropy(out, y))
            run.backward(got[-1])
            run.step()
    finally:
        run.finish()
    torch.testing.assert_close(torch.stack(got).detach(), torch.stack(want), rtol=1e-6, atol=0)


def test_fp16_skips_the_step_whose_gradients_overflow_as_the_plain_recipe_does():
    model, batches = model_and_batches()
    x, y = batches[1]
    batches[1] = (x * 1e4, y)  # its fp16 gradients overflow at the scaler's first scale: that step is skipped
    run, prepared = start(model, amp="fp16")
    want = plain_amp_losses(model, batches, F.cross_entropy, run.device, "fp16")  # on the run's device (a GPU's)
    plain_scaler = torch.amp.GradScaler(run.device.type)
    got = []
    try:
        for x, y in run.batches(feed(batches), steps=len(batches)):
            got.append(F.cross_entropy(prepared(x), y))
            run.backward(got[-1])
            run.step()
        scale = run.strategy.scaler.get_scale()
    finally:
        run.finish()
    torch.testing.assert_close(torch.stack(got).detach(), torch.stack(want), rtol=1e-6, atol=0)
    assert scale == plain_scaler.get_scale() / 2  # backed off once, after the overflow
