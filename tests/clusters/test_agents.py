"""Two agents (two ``trainscale launch`` with --nnodes 2) on 127.0.0.1: the weights of one launcher, and a
node that dies and comes back finishes with the weights of an uninterrupted run."""

from __future__ import annotations

import json
import time

import pytest
import torch
from agents import first_step_after, start_node, wait_for_file, wait_nodes
from emulate import SCRIPT, assert_same_weights, free_port

from clitools import FAST, run_cli

pytestmark = [pytest.mark.dist]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("rendezvous", [pytest.param("static", marks=[pytest.mark.slow, pytest.mark.full]), "c10d"])
def test_two_agents_train_like_one_launcher_with_two_processes(tmp_path, plain_launch, rendezvous):
    port, out = free_port(30000, 32000), tmp_path / "w.pt"

    def place(node: int) -> list[str]:
        if rendezvous == "c10d":
            return ["--rdzv-endpoint", f"127.0.0.1:{port}"]
        return ["--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    nodes = [start_node(["--nnodes", "2", *place(n), "--nproc-per-node", "1", str(SCRIPT), str(out)]) for n in range(2)]
    codes = wait_nodes(nodes, timeout=140)
    assert codes == [0, 0], "\n----\n".join(n.text for n in nodes)
    assert_same_weights(out, plain_launch)


# 60 steps of mlp on digits, a checkpoint every 20; the sample delay stretches a step to about 50 ms here, so
# that the kill lands mid-run (after the first checkpoint) whatever the machine's load.
JOB = ["--model", "mlp", "--model.width", "32", "--data", "digits", "--batch-size", "16", "--steps", "60",
       "--checkpoint.every", "20", "--data.sample_delay_ms", "3", "--optim.lr", "0.05", *FAST, "--log.every", "1"]


# A restart that resumes bit for bit: tests/survive/test_faults.py::test_kill9_with_one_restart_resumes_bit_for_bit;
# two agents meeting through c10d: the test above.
@pytest.mark.full
@pytest.mark.timeout(420)
def test_a_dead_node_comes_back_and_the_job_finishes_with_uninterrupted_weights(tmp_path):
    ref = tmp_path / "ref"
    r = run_cli(["train", "--nproc", "2", *JOB, "--checkpoint.dir", str(ref)], timeout=150, env={"OMP_NUM_THREADS": "1"})
    assert r.rc == 0, r.text
    ck, port = tmp_path / "ck", free_port(30000, 32000)
    # keep_alive 1 s x 3: the dead agent leaves the rendezvous after about 3 s (torchrun's default: 5 s x 3).
    args = ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf",
            "keep_alive_interval=1,keep_alive_max_attempt=3", "--max-restarts", "1", "--nproc-per-node", "1",
            "-m", "trainscale", "train", *JOB, "--checkpoint.dir", str(ck), "--json", str(ck / "s.json")]
    nodes = [start_node(args) for _ in range(2)]
    assert wait_for_file(ck / "step_20.pt", nodes, 150), "\n----\n".join(n.text for n in nodes)
    # c10d's rendezvous store lives in the agent that bound the endpoint first: kill the other node (losing the
    # store's host ends the job under torchrun; that needs another rendezvous backend, such as etcd).
    victim = 1 if nodes[0].hosts_port(port) else 0
    t_kill = time.monotonic()
    nodes[victim].kill()
    time.sleep(1.0)  # the replacement node starts a second later
    nodes.append(start_node(args))
    codes = wait_nodes([nodes[1 - victim], nodes[2]], timeout=240)
    text = "\n----\n".join(n.text for n in nodes)
    assert codes == [0, 0], text
    s = json.loads((ck / "s.json").read_text())
    assert (s["restarts"], s["steps"], s["resumed_from_step"]) == (1, 60, 20), text
    got, want = (torch.load(d / "last.pt", weights_only=True)["model"] for d in (ck, ref))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    seen = first_step_after(nodes, t_kill)  # reported, not asserted: timings here vary 2x with the load
    print(f"\nkill -> next completed step: {seen[0]:.1f} s (step {seen[1]})" if seen else "no step seen")
