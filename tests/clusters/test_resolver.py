"""The cluster-environment resolver against each scheduler's variables, as the schedulers document them.

Each case is the environment a scheduler gives one process (srun's task variables, Kubeflow's PET_*, a
PyTorchJob's MASTER_ADDR/WORLD_SIZE/RANK, torchrun's), and where that process must stand in the job.
"""

import pytest

from clitools import run_cli
from trainscale.distributed.cluster import ClusterError, expand_nodelist, resolve, slurm_port, unplaced
from trainscale.distributed.launcher import LaunchSpec, with_cluster

SRUN = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NAME": "train"}  # set in every srun step
RAY_WORKER = {"RAY_RAYLET_PID": "7277", "RAY_JOB_ID": "01000000"}  # set by Ray in each worker process

# (case, environment, role, expected: source, rank, world, local rank, local world, node rank, nodes, master)
CASES = [
    ("slurm 4 nodes x 1 task, node[01-04]",
     {**SRUN, "SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "2",
      "SLURM_NNODES": "4", "SLURM_JOB_NODELIST": "node[01-04]", "SLURM_TASKS_PER_NODE": "1(x4)"},
     "rank", ("slurm", 2, 4, 0, 1, 2, "4", "node01:24242")),
    ("slurm 2 nodes x 2 tasks, padded list with a gap",
     {**SRUN, "SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
      "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[07,09]", "SLURM_TASKS_PER_NODE": "2(x2)"},
     "rank", ("slurm", 3, 4, 1, 2, 1, "2", "gpu07:24242")),
    ("slurm uneven tasks per node (3,1): local world of node 1",
     {**SRUN, "SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
      "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "3,1"},
     "rank", ("slurm", 3, 4, 0, 1, 1, "2", "n1:24242")),
    ("slurm MASTER_PORT wins over the job id's port",
     {**SRUN, "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
      "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "login1,node[3-4]", "MASTER_PORT": "12345"},
     "rank", ("slurm", 0, 2, 0, 1, 0, "2", "login1:12345")),
    ("slurm step on part of the allocation: the step's first node",
     {**SRUN, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
      "SLURM_NNODES": "8", "SLURM_STEP_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[01-08]",
      "SLURM_STEP_NODELIST": "node[05-06]"},
     "rank", ("slurm", 1, 2, 0, 1, 1, "2", "node05:24242")),
    ("slurm one launcher per node (srun --ntasks-per-node=1 trainscale launch)",
     {**SRUN, "SLURM_NTASKS": "4", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
      "SLURM_NNODES": "4", "SLURM_JOB_NODELIST": "node[01-04]", "SLURM_TASKS_PER_NODE": "1(x4)"},
     "launcher", ("slurm", 0, 1, 0, 1, 1, "4", "node01:24242")),
    ("salloc shell on 2 nodes, no srun: not one of the tasks",
     {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "interactive", "SLURM_NNODES": "2", "SLURM_NTASKS": "2",
      "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "1(x2)"},
     "rank", ("single", 0, 1, 0, 1, 0, "1", None)),
    ("sbatch script itself (batch step, no srun)",
     {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NNODES": "2", "SLURM_PROCID": "0",
      "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "node[01-02]"},
     "launcher", ("single", 0, 1, 0, 1, 0, "1", None)),
    ("srun --pty bash: an interactive step of one task",
     {**SRUN, "SLURM_JOB_NAME": "bash", "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
      "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "node07"},
     "rank", ("slurm", 0, 1, 0, 1, 0, "1", "node07:24242")),
    ("kubeflow TrainJob, 4 processes per pod, launcher",
     {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1",
      "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400"},
     "launcher", ("kubeflow", 0, 1, 0, 1, 1, "2", "job-node-0-0.job:29400")),
    ("kubeflow one process per pod, as a rank; PET_* win over MASTER_ADDR/RANK",
     {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "job-node-0-0.job",
      "PET_MASTER_PORT": "29400", "MASTER_ADDR": "other", "MASTER_PORT": "1", "WORLD_SIZE": "3", "RANK": "0"},
     "rank", ("kubeflow", 2, 3, 0, 1, 2, "3", "job-node-0-0.job:29400")),
    ("pytorchjob worker, one process per pod",
     {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"},
     "rank", ("pytorchjob", 2, 3, 0, 1, 2, "3", "job-master-0:23456")),
    ("pytorchjob pod running a launcher: pods are nodes",
     {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "1"},
     "launcher", ("pytorchjob", 0, 1, 0, 1, 1, "3", "job-master-0:23456")),
    ("torchrun rank, inside an srun step too: torchrun wins",
     {**SRUN, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
      "SLURM_JOB_NODELIST": "node[01-02]", "TORCHELASTIC_RUN_ID": "x", "RANK": "5", "WORLD_SIZE": "8",
      "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
      "MASTER_ADDR": "node01", "MASTER_PORT": "29500"},
     "rank", ("torchrun", 5, 8, 1, 4, 1, "2", "node01:29500")),
    ("ray train worker on the second of 2 nodes x 2 workers (the variables Ray Train v2 sets)",
     {**RAY_WORKER, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1",
      "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "46671"},
     "rank", ("ray", 3, 4, 1, 2, 1, "2", "10.0.0.5:46671")),
    ("ray train worker inside a SLURM step: Ray wins (it made the process group)",
     {**SRUN, "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
      "SLURM_JOB_NODELIST": "n1", **RAY_WORKER, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
      "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "46671"},
     "rank", ("ray", 0, 2, 0, 1, 0, "2", "10.0.0.5:46671")),
    ("torchrun started inside a Ray task: torchrun's own variables win",
     {**RAY_WORKER, "TORCHELASTIC_RUN_ID": "x", "NODE_RANK": "0", "RANK": "1", "WORLD_SIZE": "2",
      "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     "rank", ("torchrun", 1, 2, 1, 2, 0, "1", "127.0.0.1:29500")),
    ("nothing set", {}, "rank", ("single", 0, 1, 0, 1, 0, "1", None)),
    ("MASTER_ADDR/MASTER_PORT alone (a one-process script's exports)",
     {"MASTER_ADDR": "localhost", "MASTER_PORT": "12355"}, "rank", ("single", 0, 1, 0, 1, 0, "1", None)),
]


@pytest.mark.parametrize("env,role,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_scheduler_places_the_process(env, role, expected):
    c = resolve(env, role)
    master = f"{c.master_addr}:{c.master_port}" if c.master_addr else None
    got = (c.source, c.rank, c.world_size, c.local_rank, c.local_world_size, c.node_rank, c.nnodes, master)
    assert got == expected
    assert c.why and "\n" not in c.describe()


def test_a_rank_exports_what_torch_env_init_reads():
    env = CASES[1][1]
    out = resolve(env, "rank").rank_env()
    assert out == {"MASTER_ADDR": "gpu07", "MASTER_PORT": "24242", "RANK": "3", "WORLD_SIZE": "4",
                   "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}


BAD = [
    ("LOCAL_RANK without RANK", {"LOCAL_RANK": "0", "WORLD_SIZE": "2"}, "rank", "LOCAL_RANK = '0': a launcher's "
     "variables are half-set: RANK missing"),
    ("RANK beyond WORLD_SIZE", {"RANK": "4", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, "rank",
     "RANK = 4: must be below WORLD_SIZE (4)"),
    ("RANK not a number", {"RANK": "x", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, "rank", "RANK = 'x': not an integer"),
    ("launcher inside a rank", {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "launcher",
     "already a rank of a launched job"),
    ("srun step without SLURM_PROCID", {**SRUN, "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                                        "SLURM_JOB_NODELIST": "n1"}, "rank", "SLURM_PROCID = None: unset"),
    ("SLURM_PROCID beyond SLURM_NTASKS", {**SRUN, "SLURM_NTASKS": "2", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
                                          "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-2]"}, "rank",
     "SLURM_PROCID = 2: must be below SLURM_NTASKS (2)"),
    ("SLURM_NODEID beyond SLURM_NNODES", {**SRUN, "SLURM_NTASKS": "3", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
                                          "SLURM_NODEID": "2", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"},
     "rank", "SLURM_NODEID = 2: must be below SLURM_NNODES (2)"),
    ("reversed range", {**SRUN, "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                        "SLURM_JOB_NODELIST": "node[04-01]"}, "rank", "bad range '04-01'"),
    ("unclosed bracket", {**SRUN, "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                          "SLURM_JOB_NODELIST": "node[01-"}, "rank", "unbalanced brackets"),
    ("no node list", {**SRUN, "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"},
     "rank", "SLURM_JOB_NODELIST = None: unset"),
    ("two launchers on one node", {**SRUN, "SLURM_NTASKS": "4", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
                                   "SLURM_NODEID": "0", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]",
                                   "SLURM_TASKS_PER_NODE": "2(x2)"}, "launcher", "2 tasks on this node would each "
     "start a launcher"),
    ("PET_NODE_RANK without PET_NNODES", {"PET_NODE_RANK": "1", "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "1"},
     "launcher", "PET_NNODES = None: unset while"),
    ("PET_NODE_RANK beyond PET_NNODES", {"PET_NNODES": "2", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "m",
                                         "PET_MASTER_PORT": "1"}, "launcher", "PET_NODE_RANK = 2: must be below"),
    ("4 processes per pod without a launcher", {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "4",
                                                "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "1"}, "rank",
     "PET_NPROC_PER_NODE = '4': more than one process per pod needs a launcher"),
    ("elastic PET_NNODES without a launcher", {"PET_NNODES": "1:4", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "m",
                                               "PET_MASTER_PORT": "1"}, "rank", "an elastic job needs a launcher"),
    ("bad PET_NPROC_PER_NODE", {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "many",
                                "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "1"}, "launcher", "expected a count"),
    ("WORLD_SIZE and RANK without MASTER_ADDR", {"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "1"}, "rank",
     "MASTER_ADDR = None: unset while MASTER_PORT, WORLD_SIZE, RANK are set"),
    ("ray worker with NODE_RANK but no LOCAL_WORLD_SIZE", {**RAY_WORKER, "NODE_RANK": "0", "RANK": "0",
                                                          "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "rank",
     "NODE_RANK = '0': a Ray Train worker's variables are half-set: LOCAL_WORLD_SIZE missing"),
    ("a launcher inside a Ray Train worker", {**RAY_WORKER, "NODE_RANK": "0", "RANK": "0", "WORLD_SIZE": "2",
                                              "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, "launcher",
     "this process is a Ray Train worker (a rank)"),
    ("RANK without WORLD_SIZE", {"RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "1"}, "rank",
     "WORLD_SIZE = None: unset"),
]


@pytest.mark.parametrize("env,role,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_half_set_or_contradictory_variables_are_one_line(env, role, message):
    with pytest.raises(ClusterError) as e:
        resolve(env, role)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text,hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("login1,node[3-4]", ["login1", "node3", "node4"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("node[8-10]", ["node8", "node9", "node10"]),
    ("node[098-100]", ["node098", "node099", "node100"]),
    ("127.0.0.[1-2]", ["127.0.0.1", "127.0.0.2"]),
    ("single", ["single"]),
])
def test_slurm_host_lists_expand(text, hosts):
    assert expand_nodelist(text) == hosts


def test_the_slurm_port_is_the_same_on_every_task_and_below_the_ephemeral_range():
    assert slurm_port("4242") == 24242 == slurm_port("1234242")
    assert slurm_port("77_3") == 20773  # an array task: its digits
    assert all(20000 <= slurm_port(str(j)) < 32768 for j in (0, 9999, 123456789))


def test_the_launcher_takes_nodes_from_the_scheduler_unless_given():
    env = dict(CASES[5][1])
    spec, c = with_cluster(LaunchSpec("x.py", nproc_per_node=2), env)
    assert (spec.nnodes, spec.node_rank, spec.master_addr, spec.master_port, c.source) == ("4", 1, "node01", 24242,
                                                                                           "slurm")
    argv = [a for a in spec.torchrun_argv() if not a.startswith("--shutdown-timeout")]  # where torchrun has it
    assert argv[:5] == ["--nproc-per-node=2", "--nnodes=4", "--max-restarts=0", "--node-rank=1", "--master-addr=node01"]
    torchrun_accepts(spec.torchrun_argv())
    given = LaunchSpec("x.py", nproc_per_node=2, nnodes="2", node_rank=0, master_addr="h")
    spec, c = with_cluster(given, env)
    assert (spec.nnodes, spec.master_addr, c.source) == ("2", "h", "command line")
    kube = CASES[9][1]
    spec, c = with_cluster(LaunchSpec("x.py", nproc_per_node=0), kube)
    assert (spec.nproc_per_node, spec.nnodes, spec.node_rank, spec.master_port) == (4, "2", 1, 29400)
    elastic = {**kube, "PET_NNODES": "1:3", "PET_RDZV_ENDPOINT": "job-node-0-0.job:29401"}
    spec, c = with_cluster(LaunchSpec("x.py", nproc_per_node=0), elastic)
    assert (spec.nnodes, spec.rdzv_endpoint) == ("1:3", "job-node-0-0.job:29401")


def test_launch_refuses_a_contradictory_slurm_environment_in_one_line(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    env = {**SRUN, "SLURM_NTASKS": "2", "SLURM_PROCID": "5", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_JOB_NODELIST": "n[1-2]"}
    r = run_cli(["launch", "--nproc-per-node", "1", str(script)], timeout=60, env=env)
    assert r.rc == 2 and r.err.strip() == "trainscale launch: SLURM_PROCID = 5: must be below SLURM_NTASKS (2): " \
                                          "the variables contradict each other"


def torchrun_accepts(argv: list[str]) -> None:
    """torchrun's own parser takes every option we give it (torch 2.11's torchrun has no --shutdown-timeout)."""
    from torch.distributed.run import get_args_parser

    get_args_parser().parse_args([*argv, "x.py"])  # an unknown option exits with argparse's error


def test_every_option_given_to_torchrun_is_one_this_torch_knows():
    for spec in (LaunchSpec("x.py", nproc_per_node=2), LaunchSpec("x.py", nproc_per_node=2, rdzv_endpoint="h:29400"),
                 LaunchSpec("x.py", nproc_per_node=2, nnodes="2", node_rank=1, master_addr="h")):
        torchrun_accepts(spec.torchrun_argv())


def test_a_run_the_lab_launches_itself_is_no_task_of_the_schedulers_job():
    # Inside an srun step or a Kubeflow pod, the lab's own runs are placed by their launcher options only.
    step = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
            "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[01-02]"}
    pod = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "n0", "PET_MASTER_PORT": "29500",
           "PATH": "/bin"}
    assert (resolve(step).source, resolve(pod).source) == ("slurm", "kubeflow")
    assert resolve(unplaced(step)).source == resolve(unplaced(pod)).source == "single"
    assert unplaced(pod) == {"PATH": "/bin"}
