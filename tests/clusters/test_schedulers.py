"""The run API under each scheduler's variables, emulated on this host, trains to a plain launch's weights."""

from __future__ import annotations

import pytest
from emulate import (
    SCRIPT,
    assert_same_weights,
    free_port,
    pet_env,
    script_command,
    slurm_job_for_free_port,
    spawn,
    srun_env,
    wait_all,
)

from clitools import run_cli

pytestmark = [pytest.mark.dist]


@pytest.mark.timeout(150)
def test_the_sbatch_script_trains_like_a_plain_launch_under_srun_variables(tmp_path, plain_launch):
    sbatch, out = tmp_path / "job.sbatch", tmp_path / "w.pt"
    r = run_cli(["launch", "--slurm", str(sbatch), "--nnodes", "2", "--nproc-per-node", "1", str(SCRIPT), str(out)])
    assert r.rc == 0 and "#SBATCH --nodes=2" in sbatch.read_text(), r.text
    job = slurm_job_for_free_port()
    # srun --nodes 2 --ntasks-per-node 1: the same command on each node, with that task's variables.
    procs = [spawn(script_command(sbatch), srun_env(job, nodes=2, tasks_per_node=1, procid=i)) for i in range(2)]
    results = wait_all(procs, timeout=120)
    assert [rc for rc, _ in results] == [0, 0], results
    head = results[0][1]
    assert "cluster: slurm (srun step of job" in head and "master = first host of SLURM_STEP_NODELIST" in head
    assert f"127.0.0.1:2{job[-4:]}" in head  # the master: the node list's first host, the port from the job id
    assert_same_weights(out, plain_launch)


# SLURM's and Kubeflow's variables reach a run in the default tier through the two tests around this one (and
# tests/clusters/test_resolver.py reads them all); one task per rank is the same resolution, without a launcher.
@pytest.mark.full
@pytest.mark.timeout(150)
@pytest.mark.parametrize("scheduler", ["slurm", "pytorchjob"])
def test_scheduler_tasks_as_ranks_train_like_a_plain_launch(tmp_path, plain_launch, scheduler):
    """Each task runs ``python SCRIPT`` (srun --ntasks-per-node 1; a PyTorchJob with one process per pod)."""
    out = tmp_path / "w.pt"
    if scheduler == "slurm":
        job = slurm_job_for_free_port()
        envs = [srun_env(job, nodes=2, tasks_per_node=1, procid=i) for i in range(2)]
    else:
        port = str(free_port())
        envs = [{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "RANK": str(i)} for i in range(2)]
    results = wait_all([spawn(["python", str(SCRIPT), str(out)], env) for env in envs], timeout=120)
    assert [rc for rc, _ in results] == [0, 0], results
    assert f"cluster: {scheduler} (" in results[0][1]
    assert_same_weights(out, plain_launch)


@pytest.mark.timeout(150)
def test_kubeflow_pods_with_a_launcher_train_like_a_plain_launch(tmp_path, plain_launch):
    port, out = free_port(), tmp_path / "w.pt"
    # Each pod's command is the launcher with no placement options: PET_* place it, as they place torchrun.
    procs = [spawn(["python", "-m", "trainscale", "launch", str(SCRIPT), str(out)], pet_env(2, 1, node, port))
             for node in range(2)]
    results = wait_all(procs, timeout=120)
    assert [rc for rc, _ in results] == [0, 0], results
    assert "cluster: kubeflow (PET_*" in results[0][1] and f"master 127.0.0.1:{port}" in results[0][1]
    assert_same_weights(out, plain_launch)
