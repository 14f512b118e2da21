"""Nodes come from the launcher or the scheduler: hierarchical all-reduce groups, the table, the run summary."""

from __future__ import annotations

import json

import pytest
import torch
from emulate import SCRIPT, slurm_job_for_free_port, spawn, srun_cyclic_env, wait_all

from test_ddp_parity import ATOL, RTOL, reference_weights


@pytest.mark.dist
@pytest.mark.slow  # 4 processes
@pytest.mark.timeout(240)
def test_hierarchical_groups_follow_the_schedulers_nodes_not_rank_blocks(tmp_path):
    # srun --nodes 2 --ntasks-per-node 2 --distribution cyclic: node 0 holds ranks 0 and 2, node 1 ranks 1 and 3.
    job, out, summary = slurm_job_for_free_port(), tmp_path / "w.pt", tmp_path / "s.json"
    extra = {"TRAINSCALE_ARGS": "--strategy.hierarchical true", "TRAINSCALE_JSON": str(summary)}
    procs = [spawn(["python", str(SCRIPT), str(out)], {**srun_cyclic_env(job, 2, 2, i), **extra}) for i in range(4)]
    results = wait_all(procs, timeout=230)
    assert [rc for rc, _ in results] == [0, 0, 0, 0], results
    log = results[0][1]
    assert "hierarchical all-reduce over 2 node(s): [0, 2] [1, 3]" in log
    s = json.loads(summary.read_text())
    assert (s["world_size"], s["nodes"], s["procs_per_node"], s["cluster_source"]) == (4, 2, 2, "slurm")
    # The table's node column is each rank's SLURM_NODEID: ranks 0-3 on nodes 0 1 0 1.
    rows = [ln.split("│")[1:4] for ln in log.splitlines() if ln.count("│") >= 6 and ln.split("│")[1].strip().isdigit()]
    assert [(int(r), int(n)) for r, _, n in rows] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    want, got = reference_weights(4 * 8), torch.load(out, weights_only=True)
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=ATOL, rtol=RTOL)
