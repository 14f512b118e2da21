"""``trainscale launch`` runs an ordinary torchrun script unchanged, and prints the environment table."""

import json
import os

import pytest

from clitools import run_cli

TORCHRUN_SCRIPT = '''
import json, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
torch.manual_seed(rank)              # different init per rank: DDP must broadcast rank 0's
model = DDP(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
w = [p.detach().flatten().tolist() for p in model.parameters()]
out = sys.argv[1]
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "world": world, "threads": torch.get_num_threads(), "w": w}, f)
# DDP's reducer holds the group: ended in the order that exits cleanly (trainscale/distributed/teardown.py says
# why; Gloo's workers left to interpreter exit aborted a rank twice in one loaded suite run, 2026-11-24).
from trainscale.distributed.teardown import end_process_group
end_process_group(holders=[model])
'''


@pytest.mark.dist
@pytest.mark.timeout(90)
def test_launch_runs_a_plain_torchrun_script(tmp_path):
    script = tmp_path / "plain_ddp.py"
    script.write_text(TORCHRUN_SCRIPT)
    tmp = tmp_path / "tmp"  # the launch's temporary folder, to see what it leaves there
    tmp.mkdir()
    r = run_cli(["launch", "--nproc-per-node", "2", str(script), str(tmp_path)], timeout=80, env={"TMPDIR": str(tmp)})
    assert r.rc == 0, r.text
    assert not [f.name for f in tmp.iterdir() if f.name.startswith(("torchelastic_", "trainscale-torchrun-"))]
    outs = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert [o["world"] for o in outs] == [2, 2]
    assert outs[0]["w"] == outs[1]["w"]                 # gradients were averaged: same weights
    assert "Distributed environment" in r.err and "world size 2" in r.err
    assert r.err.count("Distributed environment") == 1  # printed once
    assert all(o["threads"] >= 1 for o in outs)


@pytest.mark.dist
@pytest.mark.timeout(60)
@pytest.mark.parametrize("option,want", [([], None), pytest.param(["--threads", "1"], 1, marks=pytest.mark.full)],
                         ids=["default", "set"])
def test_threads_default_to_cores_per_process_and_can_be_set(tmp_path, option, want):
    script = tmp_path / "plain_ddp.py"
    script.write_text(TORCHRUN_SCRIPT)
    r = run_cli(["launch", "--nproc-per-node", "1", *option, str(script), str(tmp_path)], timeout=50)
    assert r.rc == 0, r.text
    # By default the cores of this process, not a silent 1 (torchrun's own default).
    assert json.loads((tmp_path / "rank0.json").read_text())["threads"] == (want or len(os.sched_getaffinity(0)))


PREPARE_SCRIPT = '''
import json, os, sys, torch
import trainscale

model, env = trainscale.prepare(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(env.rank)          # different data per rank
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
with open(os.path.join(sys.argv[1], f"p{env.rank}.json"), "w") as f:
    json.dump([p.detach().flatten().tolist() for p in model.parameters()], f)
'''


@pytest.mark.dist
@pytest.mark.timeout(90)
def test_prepare_in_a_users_own_loop(tmp_path):
    script = tmp_path / "own_loop.py"
    script.write_text(PREPARE_SCRIPT)
    r = run_cli(["launch", "--nproc-per-node", "2", str(script), str(tmp_path)], timeout=80)
    assert r.rc == 0, r.text
    w0, w1 = (json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2))
    assert w0 == w1


@pytest.mark.dist
@pytest.mark.timeout(90)
def test_train_joins_an_existing_launch(tmp_path):
    out = tmp_path / "s.json"
    r = run_cli(["launch", "--nproc-per-node", "2", "-m", "trainscale", "train", "--nproc", "2", "--steps", "5",
                 "--log.progress", "none", "--json", str(out)], timeout=80)
    assert r.rc == 0, r.text
    assert json.loads(out.read_text())["world_size"] == 2   # --nproc did not launch 2 x 2


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Two launchers meeting as nodes: the sbatch test (tests/clusters/test_schedulers.py) launches two under srun's
# variables, and tests/clusters/test_agents.py two through a c10d rendezvous.
@pytest.mark.full
@pytest.mark.dist
@pytest.mark.timeout(120)
def test_two_nodes_with_static_rendezvous_on_loopback(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "plain_ddp.py"
    script.write_text(TORCHRUN_SCRIPT)
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "trainscale", "launch", "--nnodes", "2", "--node-rank", str(n),
                               "--master-addr", "127.0.0.1", "--master-port", port, "--nproc-per-node", "1",
                               str(script), str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in range(2)]
    outs = [p.communicate(timeout=100) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert [r["world"] for r in ranks] == [2, 2] and ranks[0]["w"] == ranks[1]["w"]
    assert "Distributed environment" in outs[0][1] and "Distributed environment" not in outs[1][1]


RESTART_SCRIPT = '''
import os, sys
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 0 and os.environ["RANK"] == "1":
    sys.exit("first attempt fails on purpose")
open(os.path.join(sys.argv[1], f"ok{os.environ['RANK']}-{attempt}"), "w").close()
'''


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_max_restarts_restarts_the_workers(tmp_path):
    script = tmp_path / "flaky.py"
    script.write_text(RESTART_SCRIPT)
    r = run_cli(["launch", "--nproc-per-node", "2", "--max-restarts", "1", str(script), str(tmp_path)], timeout=100)
    assert r.rc == 0, r.text
    assert (tmp_path / "ok0-1").exists() and (tmp_path / "ok1-1").exists()
    (tmp_path / "x").mkdir()
    r = run_cli(["launch", "--nproc-per-node", "2", str(tmp_path / "flaky.py"), str(tmp_path / "x")], timeout=100)
    assert r.rc == 1 and "rank 1 failed" in r.err
