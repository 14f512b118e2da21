"""At world size 1 nothing is exchanged, so nothing wraps the model: the run API's step is the plain loop's step,
to the bit, with ``no_sync`` and clipping; a compiled model keeps the plain loop's graphs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "bare_script.py"
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240)


def run_script(tmp_path: Path, mode: str, *flags: str) -> dict:
    out = tmp_path / f"{mode}{'-'.join(flags)}.pt"
    p = subprocess.run([sys.executable, str(SCRIPT), str(out), mode, *flags], capture_output=True, text=True,
                       timeout=200, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    return torch.load(out)


def assert_bitwise_equal(got: dict, want: dict) -> None:
    assert got["weights"].keys() == want["weights"].keys()
    for k, w in want["weights"].items():
        assert torch.equal(got["weights"][k], w), f"{k} differs from the plain loop's"


def test_one_process_trains_the_bare_module_to_the_plain_loops_weights(tmp_path):
    plain, run = run_script(tmp_path, "plain"), run_script(tmp_path, "run")
    assert not run["wrapped"] and run["ran_through"] == "Sequential"  # no DDP: the user's module itself
    assert (run["layout"], run["allreduce_calls_per_step"], run["comm_bytes_per_step"]) == ("bare", 0, 0.0)
    assert run["min_norm"] > 0.5  # clipping engaged on every step
    assert_bitwise_equal(run, plain)


def test_a_compiled_model_keeps_the_plain_loops_graphs_at_world_size_1(tmp_path):
    # The script asks for one bucket per tensor: a DDP wrapper would split the compiled graph at each bucket.
    plain, run = run_script(tmp_path, "plain", "compile"), run_script(tmp_path, "run", "compile")
    assert plain["graphs"] >= 1
    assert run["graphs"] == plain["graphs"]
    assert run["ran_through"] == "OptimizedModule" and run["layout"] == "bare"
    assert run["seen_compiled"]  # what keeps DDP's bucket autotuner from re-wrapping it above world size 1
    assert_bitwise_equal(run, plain)


def test_a_compiled_model_under_ddp_keeps_one_bucket_size_dynamo_accepts():
    from trainscale.config import ConfigError
    from trainscale.strategies.ddp import compiled_bucket_mb

    assert compiled_bucket_mb(25.0, [25.0]) == (25.0, None)
    size, why = compiled_bucket_mb("auto", [0.25, 4.0, 16.0])
    assert size == 4.0 and "stay at 4 MB" in why  # the smallest candidate holding DDP's 1 MB first bucket
    with pytest.raises(ConfigError) as e:
        compiled_bucket_mb(0.0, [0.0])
    assert e.value.key == "strategy.bucket_mb" and "at least 1 MB" in str(e.value)
