"""The lab on two "nodes" of this host: the same ``trainscale bench`` / ``doctor`` command on each, node 0 leads."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from emulate import free_port

from clitools import REPO, run_cli
from trainscale.nodes import _as_node, launcher_options

JOB = ["--steps", "10", "--data.eval_size", "0", "--job.threads", "1"]


def two_ports() -> int:
    """A port P with P + 1 free too: P is each run's rendezvous, P + 1 the lab's store."""
    for _ in range(50):
        port = free_port(30000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two free ports")


def on_two_nodes(command: list[str], out, timeout: float, kubeflow: bool = False) -> tuple[list[int], list[str]]:
    """``trainscale COMMAND`` as node 0 and node 1 at once, placed by node options or (``kubeflow``) by the
    ``PET_*`` variables of a Kubeflow pod; their exit codes and outputs."""
    port = two_ports()
    procs = []
    for node in (0, 1):
        where = {"PET_NNODES": "2", "PET_NODE_RANK": str(node), "PET_MASTER_ADDR": "127.0.0.1",
                 "PET_MASTER_PORT": str(port)}
        options = ["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]
        argv = [sys.executable, "-m", "trainscale", *command, *([] if kubeflow else options),
                "--out", str(out / f"node{node}")]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1", **(where if kubeflow else {})}))
    texts = []
    try:
        for p in procs:
            texts.append(p.communicate(timeout=timeout)[0])
    finally:  # SIGTERM: the lab ends the run it has in flight, with the run's whole process tree
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.communicate()
    return [p.returncode for p in procs], texts


def test_node_options_come_from_the_command_line_else_from_slurm(monkeypatch):
    import argparse

    from trainscale.nodes import add_node_options

    p = argparse.ArgumentParser()
    add_node_options(p)
    opts = launcher_options(p.parse_args(["--nnodes", "2", "--node-rank", "1", "--master-addr", "n0"]))
    assert (opts.nnodes, opts.node_rank, opts.master_addr, opts.multi_node) == ("2", 1, "n0", True)
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[01-02]"}
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    opts = launcher_options(p.parse_args([]))
    assert (opts.nnodes, opts.node_rank, opts.master_addr, opts.master_port) == ("2", 1, "node01", 24242)
    # node 0's launcher command, as another node runs it
    assert _as_node(["launch", "--nnodes", "2", "--node-rank", "0", "x.py"], 1) == \
        ["launch", "--nnodes", "2", "--node-rank", "1", "x.py"]


def test_a_node_rank_outside_the_nodes_is_one_line():
    r = run_cli(["bench", "--nnodes", "2", "--node-rank", "2", *JOB], timeout=60)
    assert r.rc == 2 and "--node-rank = 2: from 0 to 1 (--nnodes 2)" in r.err, r.text
    assert "Traceback" not in r.text


@pytest.mark.full  # the doctor on two pods stays
@pytest.mark.dist
@pytest.mark.timeout(240)
def test_bench_on_two_nodes_node_0_reports_node_1_takes_part(tmp_path):
    codes, texts = on_two_nodes(["bench", "--nproc", "1", "--repeat", "1", *JOB], tmp_path, timeout=220)
    assert codes == [0, 0], "\n----\n".join(texts)
    doc = json.loads((tmp_path / "node0" / "bench.json").read_text())
    assert [p["nproc"] for p in doc["points"]] == [1] and doc["config"]["nnodes"] == "2"
    [summary] = [json.loads(f.read_text()) for f in (tmp_path / "node0" / "runs").glob("*.json")]
    assert (summary["world_size"], summary["nodes"], summary["procs_per_node"]) == (2, 2, 1)
    assert "took part in 1 run(s); node 0 writes the report" in texts[1], texts[1]
    assert not (tmp_path / "node1" / "bench.json").exists()  # one report, node 0's


@pytest.mark.full  # slow (34-44 s); the lab on nodes stays: test_a_taken_lab_port_is_one_line_and_leaves_no_folder
@pytest.mark.dist
@pytest.mark.timeout(300)
def test_doctor_on_two_kubeflow_pods_compares_one_process_with_one_per_node(tmp_path):
    # Placed by PET_* alone: node 0's 1-process references must not take themselves for tasks of the 2-node job
    # (they did, and waited for a peer until the run's timeout).
    cmd = ["doctor", "--nproc", "1", "--quick", "--repeat", "2", "--budget", "1", "--cycles", "3", "--phase-steps", "4",
           "--data.eval_size", "0", "--timeout", "120"]
    codes, texts = on_two_nodes(cmd, tmp_path, timeout=280, kubeflow=True)
    assert codes == [0, 0], "\n----\n".join(texts)
    doc = json.loads((tmp_path / "node0" / "doctor.json").read_text())
    assert (doc["config"]["nproc"], doc["config"]["nnodes"], doc["nproc"]) == (2, 2, 2) and doc["causes"]
    nodes = {f.name: json.loads(f.read_text())["nodes"] for f in (tmp_path / "node0" / "runs").glob("phases_*.json")}
    assert nodes == {"phases_n1_r0.json": 1, "phases_n1_r1.json": 1, "phases_n2_r0.json": 2, "phases_n2_r1.json": 2}
    assert "took part in 2 run(s)" in texts[1], texts[1]  # the 1-process references run on node 0 alone


def test_a_taken_lab_port_is_one_line_and_leaves_no_folder(tmp_path):
    port = two_ports()
    with socket.socket() as s:
        s.bind(("0.0.0.0", port + 1))
        s.listen()
        r = run_cli(["bench", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                     str(port), "--out", str(tmp_path / "b"), *JOB], timeout=60)
    assert r.rc == 2 and f"--master-port = {port}: the lab's store needs the port above it free" in r.err, r.text
    assert "Traceback" not in r.text and not (tmp_path / "b").exists()


@pytest.mark.full
@pytest.mark.dist
@pytest.mark.timeout(300)
def test_plan_calibrate_on_two_nodes_measures_the_link_and_forecasts_them(tmp_path):
    cmd = ["plan", "calibrate", "--nproc", "2", "--model", "mlp", "--data", "digits", "--steps", "12",
           "--data.eval_size", "0"]
    codes, texts = on_two_nodes(cmd, tmp_path, timeout=280)
    assert codes == [0, 0], "\n----\n".join(texts)
    cal = json.loads((tmp_path / "node0").read_text())
    # This node's all-reduce at 2; over both nodes at 2 per node and at 1 per node (the link alone).
    assert (cal["nnodes"], set(cal["allreduce"]), set(cal["across"])) == (2, {"2"}, {"1", "2"})
    assert set(cal["replay"]) == {"2", "4"} and all(v["beta"] >= 0 for v in cal["across"].values())
    # The hierarchical all-reduce as the DDP hook runs it, at 2 per node (1 per node has one level only).
    assert set(cal["across_hier"]) == {"2"} and set(cal["replay_hier"]) == {"4"}
    assert cal["across_hier"]["2"]["alpha"] > 0 and cal["replay_hier"]["4"]["steps"] >= 8
    assert "hierarchical (node reduce-scatter, all-reduce across, node all-gather): alpha" in texts[0], texts[0]
    assert "took part in 2 run(s); node 0 writes the report" in texts[1], texts[1]
    assert not (tmp_path / "node1").exists()  # one file, node 0's
    r = run_cli(["plan", "--calibration", str(tmp_path / "node0"), "--nproc", "2,4", "--out", str(tmp_path / "p"),
                 "--json", str(tmp_path / "p.json"), "--hierarchical"], timeout=60)
    assert r.rc == 0, r.text
    plan = json.loads((tmp_path / "p.json").read_text())
    assert [(p["world_size"], p["nodes"]) for p in plan["points"]] == [(2, 1), (4, 2)]
    # 2 x 2 hierarchical: the skeleton measured with the hook's exchange
    assert plan["points"][1]["step_time_s"] == pytest.approx(cal["replay_hier"]["4"]["step_s"])
