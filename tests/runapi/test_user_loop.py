"""A nanoGPT-style loop on the run API: accumulation driven by the script through ``run.no_sync()`` gives the
weights of ``strategy.grad_accum`` with one exchange per optimizer step (overlap on or off), a scheduler stepped on ``run.step()``'s
True moves once per optimizer step, and ``run.all_reduce`` / ``run.mean`` reduce over the ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clitools import run_cli

SCRIPT = Path(__file__).parent / "user_loop_script.py"


def train(tmp_path: Path, mode: str, overrides: str = "") -> dict:
    out = tmp_path / f"{mode}{len(overrides)}.pt"
    r = run_cli(["launch", "--nproc-per-node", "2", str(SCRIPT), str(out), mode], timeout=150,
                env={"TRAINSCALE_ARGS": overrides})
    assert r.rc == 0, r.text[-3000:]
    return torch.load(out)


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_no_sync_accumulation_equals_grad_accum_with_one_exchange_per_step(tmp_path):
    builtin, own = train(tmp_path, "builtin"), train(tmp_path, "no_sync")
    for k, want in builtin["weights"].items():
        torch.testing.assert_close(own["weights"][k], want, atol=1e-6, rtol=1e-5)
    # One all-reduce per optimizer step (one bucket): no_sync skipped the first micro-step's exchange. Without
    # it the weights would be equal too (averaging is linear), so the count is what shows the skip.
    assert builtin["calls"] == own["calls"] == 6
    # The scheduler moved once per optimizer step under grad_accum 2 (6 values, not 12), as without accumulation.
    assert builtin["lrs"] == own["lrs"] == pytest.approx([0.2 / (1 + i) for i in range(6)])
    # Reductions over 2 ranks (rank r holds r + 1, 10 r, 2 r).
    assert own["sums"].tolist() == [3.0, 10.0] and own["maxes"].tolist() == [2.0]
    assert own["mean_in_place"].tolist() == [1.0] and own["mean"].item() == 1.0
    assert "op = 'avg': must be one of sum, max, min, product, mean" in own["errors"][0]
    assert "needs a floating-point tensor" in own["errors"][1]
    assert "run.no_sync() with strategy.grad_accum = 2" in builtin["errors"][2]


@pytest.mark.full  # no_sync's accumulation with overlap on: the test above
@pytest.mark.dist
@pytest.mark.timeout(240)
def test_no_sync_with_overlap_off_exchanges_once_at_the_step(tmp_path):
    # Overlap off: the exchange waits for run.step() and happens once there, whatever no_sync says.
    builtin, late = train(tmp_path, "builtin"), train(tmp_path, "no_sync", "--strategy.overlap false")
    for k, want in builtin["weights"].items():
        torch.testing.assert_close(late["weights"][k], want, atol=1e-6, rtol=1e-5)
    assert late["calls"] == 0  # DDP's own hook never ran: trainscale exchanged the buckets after backward


def test_no_sync_is_refused_under_a_pipeline():
    from trainscale.config import StrategyConfig
    from trainscale.strategies import CommMeter, Strategy
    from trainscale.strategies.layouts.pipeline import PipelineLayout

    meter = CommMeter()
    layout = PipelineLayout(torch.nn.Linear(2, 2), meter, object(), StrategyConfig())  # type: ignore[arg-type]
    st = Strategy(layout, lambda: None, torch.amp.GradScaler("cpu", enabled=False), meter)
    with pytest.raises(RuntimeError, match="no_sync\\(\\) under a pipeline"):
        st.no_sync()
