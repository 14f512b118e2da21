"""How trainscale gets into a script: the user's command read, and the sitecustomize that acts only when asked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainscale.errors import ConfigError
from trainscale.inject import pythonpath
from trainscale.inject.command import parse_command, uses_run_api
from trainscale.jobs import RunFailed, RunSpec, gpu_shortage, run_train


def test_commands_as_users_run_them(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    cases = {
        ("python", "-u", str(script), "--lr", "1"): ("python", None, [str(script), "--lr", "1"], []),
        ("torchrun", "--standalone", "--nproc-per-node", "4", str(script)): ("torchrun", 4, [str(script)],
                                                                               ["--standalone"]),
        ("python3", "-m", "torch.distributed.run", "--nproc_per_node=2", str(script)): ("torchrun", 2, [str(script)],
                                                                                          []),
        ("accelerate", "launch", "--num_processes", "2", "--mixed_precision", "no", str(script)):
            ("accelerate", 2, [str(script)], ["--mixed_precision", "no"]),
        ("torchrun", "--nproc-per-node", "2", "-m", "pkg.train", "--a"): ("torchrun", 2, ["-m", "pkg.train", "--a"],
                                                                           []),
    }
    for argv, (launcher, nproc, rest, options) in cases.items():
        cmd = parse_command(list(argv))
        assert (cmd.launcher, cmd.nproc, cmd.script, cmd.options) == (launcher, nproc, rest, options), argv
    assert not uses_run_api([str(script)])
    (tmp_path / "ported.py").write_text("import torch\nimport trainscale\n")
    assert uses_run_api([str(tmp_path / "ported.py")])


@pytest.mark.parametrize("argv", [["ls", "-l"], ["bash", "run.sh"], [], ["python"],
                                  ["torchrun", "--nproc-per-node", "0", "t.py"], ["torchrun", "--nproc-per-node"]])
def test_what_is_not_a_python_training_run_is_one_line(argv):
    with pytest.raises(ConfigError) as e:
        parse_command(argv)
    assert "\n" not in str(e.value)


CHILD = """
import multiprocessing as mp, sys
import torch
import trainscale.inject.agent as a

def child(q):
    import trainscale.inject.agent as b
    q.put(b._agent is not None)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    print("main", a._agent is not None, "child", q.get())
    p.join()
"""


@pytest.mark.timeout(120)
def test_sitecustomize_chains_and_acts_only_in_a_rank_main_process(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    (tmp_path / "job.py").write_text(CHILD)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSCALE_") and k != "RANK"}
    base["PYTHONPATH"] = pythonpath(str(theirs))
    probe = "import os, torch, trainscale.inject.agent as a; print(os.environ.get('THEIRS_RAN'), a._agent is not None)"

    def run(env: dict[str, str], *args: str) -> str:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=100,
                              cwd=tmp_path).stdout.strip()

    assert run(base, "-c", probe) == "1 False"  # not asked: the user's own sitecustomize still runs
    assert run({**base, "TRAINSCALE_INJECT": "1"}, "-c", probe) == "1 False"  # not a rank
    asked = {**base, "TRAINSCALE_INJECT": "1", "RANK": "0", "WORLD_SIZE": "1"}
    assert run(asked, "-c", probe) == "1 True"
    assert run(asked, "job.py") == "main True child False"  # a spawned worker is never instrumented


def test_a_failure_to_instrument_is_the_runs_one_line_and_never_the_jobs(tmp_path):
    """The agent cannot start (here: an option it does not know): the script runs on, and the lab's line for the
    run without a summary says why, instead of asking to port the script to the run API."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSCALE_") and k != "RANK"}
    summary = tmp_path / "run.json"
    env.update(PYTHONPATH=pythonpath(), TRAINSCALE_INJECT="1", RANK="0", WORLD_SIZE="1",
               TRAINSCALE_ARGS="--job.no_such_option 1", TRAINSCALE_JSON=str(summary))
    p = subprocess.run([sys.executable, "-c", "import torch; print('ran', torch.ones(1).item())"], capture_output=True,
                       text=True, env=env, timeout=100, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "ran 1.0"
    why = (tmp_path / "run.json.why").read_text().strip()
    assert why.startswith("trainscale inject: not instrumented (") and "no_such_option" in why, why



def test_two_ranks_on_one_gpu_that_the_framework_cannot_share_is_said_so():
    """The Hugging Face Trainer on an H200 with 2 processes (its DDP wrapper gets device_ids=[local rank]): the
    failure names the shortage of GPUs, not only the IndexError deep in DDP; nothing is added where GPUs suffice."""
    trace = ('[rank1]:   File ".../torch/nn/parallel/_functions.py", line 174, in _get_stream\n'
             "[rank1]:     if _streams[device.index] is None:\n[rank1]: IndexError: list index out of range\n")
    said = gpu_shortage(trace, nproc=2, gpus=1)
    assert said.startswith("2 processes share this node's 1 GPU(s)") and "on the CPU" in said
    assert gpu_shortage("RuntimeError: CUDA error: invalid device ordinal", 4, 2)
    assert gpu_shortage(trace, nproc=2, gpus=2) == gpu_shortage(trace, nproc=2, gpus=0) == ""
    assert gpu_shortage("IndexError: list index out of range", nproc=2, gpus=1) == ""  # the user's own bug


def test_rank_0s_reason_is_kept_when_another_rank_then_fails(tmp_path):
    """Rank 0 left why the run has no summary, then the job exited non-zero (another rank's teardown, seen once
    in CI as a SIGABRT): the line starts with the reason and keeps the failure after it."""
    script = tmp_path / "leaves.py"
    script.write_text("import os, sys\nopen(os.environ['TRAINSCALE_JSON'] + '.why', 'w').write('observed only\\n')\n"
                      "sys.exit('a rank died at exit')\n")
    spec = RunSpec(1, [], tmp_path / "leaves_n1.json", "leaves.py at 1", script=[str(script)])
    with pytest.raises(RunFailed) as e:
        run_train(spec, 60)
    said = str(e.value)
    assert said.startswith("leaves.py at 1 failed: observed only | ") and "rank 0 failed: exit code 1" in said, said
