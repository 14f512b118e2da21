"""Ray Train: the run-API script on a local Ray cluster of two nodes trains to a plain launch's weights."""

from __future__ import annotations

import json
import os
import shlex

import psutil
import pytest
import torch
from emulate import SCRIPT, assert_same_weights

from clitools import run_cli
from trainscale.ray import RayConfig, worker_env

pytestmark = [pytest.mark.dist]


def test_the_workers_get_the_labs_switches_after_the_configs_args():
    cfg = RayConfig(args=("--strategy.local_sgd", "4"), env={"X": "1"})
    env = worker_env(cfg, {"TRAINSCALE_ARGS": "--job.steps 40", "TRAINSCALE_JSON": "s.json", "PATH": "/bin"})
    assert env == {"TRAINSCALE_ARGS": "--strategy.local_sgd 4 --job.steps 40", "TRAINSCALE_JSON": "s.json", "X": "1"}


def test_bad_ray_input_is_one_line(capsys):
    from trainscale.ray import main

    assert main(["--num-workers", "0", "x.py"]) == 2
    assert capsys.readouterr().err.strip() == "python -m trainscale.ray: ray.num_workers = 0: must be >= 1"
    assert main(["no/such/script.py"]) == 2
    assert "script = 'no/such/script.py': no such file" in capsys.readouterr().err


def _ray_processes() -> list[str]:
    """Ray's processes below this one (raylets, GCS, workers): none may outlive the test."""
    kids = psutil.Process().children(recursive=True)
    return [" ".join(p.cmdline()[:3]) for p in kids if p.is_running() and "ray" in " ".join(p.cmdline()).lower()]


# The strategies that change the exchange (ZeRO shards the optimizer; local SGD averages every 2 steps), as the
# same configuration overrides a user gives trainscale launch.
STRATEGIES = [(), ("--strategy.shard_optimizer", "true"), ("--strategy.local_sgd_period", "2")]


def _plain(tmp_path, args: tuple[str, ...]) -> dict:
    """``trainscale launch --nproc-per-node 2`` of the parity script with ``args`` as the lab would pass them."""
    out = tmp_path / f"plain{len(args)}{'-'.join(args)}.pt"
    r = run_cli(["launch", "--nproc-per-node", "2", str(SCRIPT), str(out)], timeout=120,
                env={"OMP_NUM_THREADS": "1", "TRAINSCALE_ARGS": shlex.join(args)})
    assert r.rc == 0, r.text
    return torch.load(out, weights_only=True)


@pytest.mark.slow  # Ray's start-up alone takes 30-90 s on this 2-core host, and each fit another 20-60 s
@pytest.mark.skipif(os.environ.get("TRAINSCALE_RAY_CLUSTER") != "1",
                    reason="a two-raylet Ray cluster takes 3-6 min here: set TRAINSCALE_RAY_CLUSTER=1")
@pytest.mark.timeout(600)
def test_ray_train_on_a_two_node_ray_cluster_trains_like_a_plain_launch(tmp_path, plain_launch, monkeypatch):
    pytest.importorskip("ray.train.torch", reason="Ray Train is not installed (pip install 'trainscale[ray]')")
    import ray
    from ray.cluster_utils import Cluster

    from trainscale.ray import fit

    # A loaded 2-core host can take longer than Ray's 10 s default for a raylet to register with the GCS.
    monkeypatch.setenv("RAY_raylet_start_wait_time_s", "120")
    # Two Ray nodes (two raylets), one CPU so one worker each. A second node on 127.0.0.2 never reached the GCS here.
    cluster = Cluster()
    try:
        cluster.add_node(num_cpus=1, include_dashboard=False)
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address)
        for i, args in enumerate(STRATEGIES):
            out, summary = tmp_path / f"w{i}.pt", tmp_path / f"run{i}.json"
            cfg = RayConfig(num_workers=2, storage_path=str(tmp_path / "ray"), args=args, name=f"parity{i}",
                            env={"TRAINSCALE_JSON": str(summary), "OMP_NUM_THREADS": "1"})
            result = fit(SCRIPT, [str(out)], cfg)
            assert result.error is None, result.error
            assert_same_weights(out, plain_launch if not args else _plain(tmp_path, args))
            s = json.loads(summary.read_text())
            # Ray Train numbers nodes by IP (NODE_RANK), and both raylets have this host's: one node of two workers.
            assert (s["cluster_source"], s["nodes"], s["procs_per_node"], s["world_size"]) == ("ray", 1, 2, 2)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert _ray_processes() == []
