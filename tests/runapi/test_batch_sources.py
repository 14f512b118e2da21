"""Batches from anywhere: a function that returns this rank's batch, or an IterableDataset, sharded by the user.

What a user relies on: the same weights at 1 and 2 processes when each rank takes its share, the run's global
batch counted from the source's batches, and one clear line for a function given no step count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from clitools import run_cli

SCRIPT = Path(__file__).parent / "source_script.py"
pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]


def train(tmp_path: Path, nproc: int, mode: str) -> tuple[dict, dict]:
    out, summary = tmp_path / f"{mode}-{nproc}.pt", tmp_path / f"{mode}-{nproc}.json"
    r = run_cli(["launch", "--nproc-per-node", str(nproc), str(SCRIPT), str(out), mode], timeout=180,
                env={"TRAINSCALE_JSON": str(summary)})
    assert r.rc == 0, r.text[-3000:]
    return torch.load(out), json.loads(summary.read_text())


@pytest.mark.parametrize("mode", ["function", pytest.param("iterable", marks=pytest.mark.full)])
def test_a_users_batch_source_trains_the_same_weights_at_1_and_2_processes(tmp_path, mode):
    one, s1 = train(tmp_path, 1, mode)
    two, s2 = train(tmp_path, 2, mode)
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=1e-6, rtol=1e-5)
    assert s1["global_batch"] == s2["global_batch"] == 8 and s1["steps"] == s2["steps"] == 5


def test_a_batch_function_without_a_step_count_is_one_clear_line(tmp_path):
    r = run_cli(["launch", "--nproc-per-node", "1", str(SCRIPT), str(tmp_path / "x.pt"), "function-no-steps"],
                timeout=120)
    assert r.rc != 0
    assert "run.batches over a batch function needs steps=N: it has no epoch to end" in r.err
    assert "Traceback" not in r.err  # bad input: one line, not a traceback per rank


def test_an_iterable_resumes_where_its_pass_stood_and_an_iterator_that_ends_is_one_line():
    from torch.utils.data import IterableDataset

    from trainscale.train.errors import RunError
    from trainscale.train.feed.sources import BatchSource

    class Three(IterableDataset):
        def __iter__(self):
            return (torch.full((2,), float(i)) for i in range(3))

    cpu = torch.device("cpu")
    first = BatchSource(Three(), cpu)
    assert [next(first)[0].item() for _ in range(5)] == [0, 1, 2, 0, 1]  # a new pass after each end
    resumed = BatchSource(Three(), cpu)
    resumed.load_state_dict(first.state_dict())
    assert [next(resumed)[0].item() for _ in range(3)] == [2, 0, 1]  # what the first source would have given
    once = BatchSource(iter([torch.ones(2)] * 2), cpu)
    next(once), next(once)
    with pytest.raises(RunError, match="the batch iterator ran out"):
        next(once)
