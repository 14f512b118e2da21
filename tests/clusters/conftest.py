"""The reference every multi-node emulation must reproduce: a plain 2-process launch on this node."""

from __future__ import annotations

import pytest
import torch
from emulate import SCRIPT

from clitools import run_cli


@pytest.fixture(scope="session")
def plain_launch(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The weights of ``trainscale launch --nproc-per-node 2`` running the run-API parity script."""
    out = tmp_path_factory.mktemp("plain") / "w.pt"
    r = run_cli(["launch", "--nproc-per-node", "2", str(SCRIPT), str(out)], timeout=120, env={"OMP_NUM_THREADS": "1"})
    assert r.rc == 0, r.text
    return torch.load(out, weights_only=True)
