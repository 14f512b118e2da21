"""A plain DDP script, unmodified, under trainscale: same weights as without it, and the doctor names its fault."""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest
import torch
from inject_helpers import SCRIPTS, injected, torchrun
from torch import nn

from clitools import read_json, run_cli
from trainscale.inject.graph_end import GraphEnd
from trainscale.jobs import RunFailed
from trainscale.train.instruments import ComputeClock

pytestmark = pytest.mark.dist


@pytest.mark.timeout(240)
def test_instrumented_run_keeps_the_weights_bit_for_bit(tmp_path):
    ref, ins = tmp_path / "ref.pt", tmp_path / "ins.pt"
    plain = torchrun("ddp_train.py", ["--steps", "12", "--width", "64", "--save", str(ref)])
    assert plain.returncode == 0, plain.stderr[-2000:]
    summary = injected("ddp_train.py", ["--steps", "12", "--width", "64", "--save", str(ins)], tmp_path)
    a, b = torch.load(ref), torch.load(ins)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the summary is the run API's: the lab reads it as it reads any run's
    read_json(tmp_path / "ddp_train_n2.json")
    assert summary["world_size"] == 2 and summary["steps"] == 12 and summary["measured_steps"] > 0
    assert summary["injected"]["framework"]["name"] == "PyTorch"
    assert summary["injected"]["measurements"]["step"] == "measured"
    assert summary["injected"]["ddp"][0]["find_unused_parameters"] is False


@pytest.mark.timeout(400)
def test_doctor_names_a_slow_collate_as_input(tmp_path):
    out = tmp_path / "doc"
    r = run_cli(["doctor", "--nproc", "2", "--repeat", "2", "--quick", "--cycles", "4", "--phase-steps", "6",
                 "--out", str(out), "--", "torchrun", "--nproc-per-node", "2", str(SCRIPTS / "ddp_train.py"),
                 "--slow-collate-ms", "20", "--steps", "100000"], timeout=380)
    assert r.rc == 0, r.err[-3000:]
    doc = read_json(out / "doctor.json")
    assert doc["bottleneck"]["name"] == "input"
    summaries = [read_json(p) for p in (out / "runs").glob("*.json")]
    assert summaries and all(s["injected"]["framework"]["name"] == "PyTorch" for s in summaries)


@pytest.mark.timeout(120)
def test_bad_commands_are_one_line(tmp_path):
    for cmd in (["ls", "-l"], ["bash", "train.sh"], ["torchrun", "--nproc-per-node", "x", "t.py"]):
        r = run_cli(["doctor", "--nproc", "2", "--out", str(tmp_path / "d"), "--", *cmd], timeout=60)
        assert r.rc == 2 and len(r.err.strip().splitlines()) == 1, (cmd, r.err)
    assert not (tmp_path / "d").exists()


NEVER_STEPS = """
import torch
model = torch.nn.Linear(4, 4)
print(model(torch.randn(2, 4)).sum().item())
"""

CRASH = """
import torch
raise RuntimeError("the user's own bug at start")
"""


@pytest.mark.timeout(240)
def test_a_script_without_steps_or_that_crashes_is_named(tmp_path):
    (tmp_path / "never.py").write_text(NEVER_STEPS)
    (tmp_path / "crash.py").write_text(CRASH)
    never = run_cli(["bench", "--nproc", "1", "--repeat", "1", "--out", str(tmp_path / "b"), "--", "python",
                     str(tmp_path / "never.py")], timeout=120)
    assert never.rc == 1 and "never stepped an optimizer" in " ".join(never.err.split())
    crash = run_cli(["bench", "--nproc", "1", "--repeat", "1", "--out", str(tmp_path / "c"), "--", "python",
                     str(tmp_path / "crash.py")], timeout=120)
    assert crash.rc == 1 and "the user's own bug at start" in crash.err


@pytest.mark.timeout(240)
def test_a_hook_that_cannot_be_reached_is_reported_never_fatal(tmp_path, monkeypatch):
    phased = ["--ablate.phases", "base,no_data,no_comm", "--ablate.phase_steps", "3", "--steps", "12"]
    monkeypatch.setenv("TRAINSCALE_INJECT_SKIP", "ddp,data_wait")  # as on a PyTorch without those hooks
    s = injected("ddp_train.py", ["--steps", "100000", "--width", "64"], tmp_path, switches=phased)
    m = s["injected"]["measurements"]
    assert m["step"] == "measured" and m["ddp"].startswith("not measured") and m["data_wait"].startswith("not")
    assert set(s["injected"]["experiments_not_run"]) == {"no_data", "no_comm"}
    monkeypatch.setenv("TRAINSCALE_INJECT_SKIP", "step")  # nothing to time: the run ends, observed only, and says so
    with pytest.raises(RunFailed, match="observed only"):
        injected("ddp_train.py", ["--steps", "8", "--width", "64"], tmp_path)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("reads", ["under_no_grad", "with_grad"])
def test_an_evaluation_pass_runs_to_its_end_and_is_no_step_s_time(tmp_path, reads):
    """An evaluation pass after each step (a held-out loader whose collate sleeps 40 ms a batch, 2 batches) runs
    whole in every phase: ``no_data`` replays the training loader's batch only (replaying the held-out one, its
    loop never ended: the doctor hung on such a script). Its time is no step's, whether its loop takes its
    batches under no_grad or outside it (the Hugging Face Trainer's way)."""
    phased = ["--ablate.phases", "base,no_data", "--ablate.phase_steps", "3", "--steps", "13"]
    args = ["--steps", "100000", "--width", "64", "--eval-every", "1", "--eval-collate-ms", "40",
            *(["--eval-reads-with-grad"] if reads == "with_grad" else [])]
    s = injected("ddp_train.py", args, tmp_path, switches=phased, timeout=100)
    log = (tmp_path / "ddp_train_n2.log").read_text()
    assert log.count("eval at step") >= 6 and "eval at step 12: 256 samples" in log, log[-3000:]
    assert s["phases"]["no_data"]["measured_steps"] > 0 and "no_data" not in s["injected"]["experiments_not_run"]
    for ph in ("base", "no_data"):  # a pass counted in would add 80 ms (at least) to every step
        steps = s["phases"][ph]["rank_step_time_s"]
        assert max(steps) < 0.04 and s["phases"][ph]["data_wait_frac"] < 0.5, (ph, steps, s["phases"][ph])
    assert s["injected"]["setup"]["evaluation_passes"] >= 12


@pytest.mark.timeout(240)
def test_a_frozen_teacher_s_forward_is_part_of_the_step(tmp_path):
    """A DDP model that never trains, run without gradients inside each step (a distillation teacher), is the
    step's own work, not an evaluation pass."""
    s = injected("ddp_train.py", ["--steps", "100000", "--width", "64", "--teacher"], tmp_path,
                 switches=["--steps", "12"])
    assert s["injected"]["setup"]["evaluation_passes"] == 0 and s["measured_steps"] > 0


@pytest.mark.timeout(240)
def test_replicas_agree_again_after_a_no_comm_phase(tmp_path):
    # Blocks of 4 steps after 3 of warm-up: base, no_comm (replicas drift: each rank sees its own data), base.
    phased = ["--ablate.phases", "base,no_comm", "--ablate.phase_steps", "4"]
    each = tmp_path / "w"
    s = injected("ddp_train.py", ["--steps", "13", "--width", "64", "--save-each", str(each)], tmp_path,
                 switches=phased)
    assert s["phases"]["no_comm"]["measured_steps"] > 0
    a, b = torch.load(f"{each}.rank0"), torch.load(f"{each}.rank1")
    assert all(torch.equal(a[k], b[k]) for k in a)  # rank 0's weights broadcast when no_comm ended


@pytest.mark.timeout(240)
@pytest.mark.parametrize("model", ["eager", "compiled"])
def test_no_comm_stops_the_exchange_of_an_eager_and_a_compiled_model(tmp_path, model):
    # The script ends inside a no_comm block (steps 8-11, after 3 of warm-up and a base block): each rank has
    # stepped on its own gradients since step 8, and no broadcast has made the replicas agree again.
    phased = ["--ablate.phases", "base,no_comm", "--ablate.phase_steps", "4"]
    each = tmp_path / "w"
    compiled = ["--compile"] if model == "compiled" else []
    s = injected("ddp_train.py", ["--steps", "10", "--width", "64", "--save-each", str(each), *compiled], tmp_path,
                 switches=phased, timeout=200)
    assert not s["injected"]["experiments_not_run"]
    a, b = torch.load(f"{each}.rank0"), torch.load(f"{each}.rank1")
    assert not all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.timeout(200)
def test_compute_is_not_measured_without_the_backward_hook(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINSCALE_INJECT_SKIP", "backward")  # as on a PyTorch without the autograd callback
    s = injected("ddp_train.py", ["--steps", "100000"], tmp_path,
                 switches=["--steps", "13", "--ablate.phases", "base,no_comm", "--ablate.phase_steps", "4"])
    read_json(tmp_path / "ddp_train_n2.json")  # still a valid run summary
    assert s["injected"]["measurements"]["backward"].startswith("not measured")
    assert math.isnan(s["compute_s"]) and all(math.isnan(c) for c in s["rank_compute_s"])
    base = s["phases"]["base"]
    assert all(math.isnan(c) for c in base["rank_compute_s"]) and math.isfinite(base["step_time_s"])
    assert all(math.isnan(row[2]) for rows in base["rank_steps"] for row in rows)


def test_the_graph_end_is_one_hook_kept_on_the_last_gradient():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    own, kept = ComputeClock(torch.device("cpu")), ComputeClock(torch.device("cpu"))
    end = GraphEnd(kept, [SimpleNamespace(module=model)])  # a DDP's module, as the agent finds it
    for _ in range(3):
        own.start()
        kept.t0 = own.t0
        loss = model(torch.randn(4, 8)).sum()
        own.watch(loss)  # the clock's own mark: its callback at the graph's end
        assert end.begin()
        loss.backward()
        end.done()
        assert 0 < kept.spent <= own.spent  # the last gradient is accumulated before the graph's end callback
        own.end_step(True)
        kept.end_step(True)
    assert end.state == GraphEnd.KEPT and any(end.param is p for p in model[0].parameters())  # first layer: last
    assert len(kept.times) == 3 and all(t > 0 for t in kept.times)
    # A backward that leaves the kept parameter out is marked where it returns; the clock's own hook from then on.
    kept.start()
    assert end.begin()
    model[2](torch.randn(4, 16)).sum().backward()
    end.done()
    assert kept.spent > 0 and end.state == GraphEnd.OFF and not end.begin()


def test_the_agent_keeps_the_losses_values_not_their_graphs():
    from trainscale.config import load_config
    from trainscale.inject.agent import Agent

    agent = Agent(load_config(), 0, 1, "")
    model = nn.Linear(8, 1)
    losses = []
    for retain in (False, True):  # Tensor.backward passes (gradient, retain_graph, create_graph) positionally
        losses.append(model(torch.randn(4, 8)).pow(2).mean())
        agent.backward(torch.autograd.backward, losses[-1], (None, retain, False), {})
    assert agent.micro == 2 and agent.loss_first.grad_fn is None  # the first step's graph is not held
    assert agent.loss_first.item() == losses[0].item()
    assert agent.loss_last.grad_fn is None and agent.loss_last.item() == losses[1].item()  # nor a retained one


def test_the_agent_finds_the_device_of_a_model_no_framework_wrapped():
    """At one process the Hugging Face Trainer wraps nothing in DDP: the agent reads the device from the
    optimizer's parameters (on an H200 it took the Trainer's GPU model for a CPU one, and counted no host syncs)."""
    from trainscale.config import load_config
    from trainscale.inject.agent import Agent

    agent = Agent(load_config(), 0, 1, "")
    assert agent._device() == torch.device("cpu")  # nothing seen yet
    agent.optimizers.append(torch.optim.SGD(nn.Linear(2, 2, device="meta").parameters(), lr=0.1))
    assert agent._device() == torch.device("meta")  # any device but the CPU default: the GPU's, on a GPU


@pytest.mark.timeout(300)
def test_the_injected_phases_measure_a_slow_collate_as_data_wait(tmp_path):
    """A 20 ms collate is the base phase's data wait and not its compute, the batch that ``no_data`` replays waits
    for nothing, and every measured step carries its rank's accounting (run-queue, CPU, the exchange's wait)."""
    phased = ["--ablate.phases", "base,no_data", "--ablate.phase_steps", "6", "--steps", "31"]
    s = injected("ddp_train.py", ["--steps", "100000", "--width", "64", "--slow-collate-ms", "20"], tmp_path,
                 switches=phased)
    # rows: [cycle, step, compute, data wait, run-queue (training thread), run-queue (+ backend), CPU, exchange wait]
    rows = {name: [row for rank in part["rank_steps"] for row in rank] for name, part in s["phases"].items()}
    assert set(rows) == {"base", "no_data"} and all(len(r) >= 2 * 5 for r in rows.values())
    assert all(0.018 <= row[3] < row[1] and 0 < row[2] < 0.018 for row in rows["base"]), rows["base"]
    assert all(row[3] < 0.005 and 0 < row[2] < 0.018 for row in rows["no_data"]), rows["no_data"]
    assert all(math.isfinite(x) and x >= 0 for r in rows.values() for row in r for x in row[4:8]), rows


@pytest.mark.timeout(240)
def test_a_script_s_own_fsdp_exchange_is_measured_since_it_cannot_be_switched_off(tmp_path):
    """FSDP2 (``fully_shard``) gathers parameters in every step: ``no_comm`` keeps the exchange and says so; its
    units and bytes are the run API's ``fsdp`` object, and each step's exposed wait in the collectives is measured
    (the lab derives ``no_comm`` from it, ``lab.terms.measured_exchange``)."""
    phased = ["--ablate.phases", "base,no_data,no_comm", "--ablate.phase_steps", "4", "--steps", "27"]
    s = injected("ddp_train.py", ["--steps", "100000", "--width", "64", "--fsdp"], tmp_path, switches=phased)
    unrun = s["injected"]["experiments_not_run"]
    assert "FSDP" in unrun["no_comm"] and "no_data" not in unrun
    elements = (64 * 64 + 64) + (64 * 64 + 64) + (64 * 10 + 10)  # the three Linear units'; the root owns none
    f = s["fsdp"]
    assert f["units"] == 3 and f["reshard_after_forward"] and f["reduce_dtype"] == "fp32"
    assert f["reduce_scatter_bytes_per_step"] == pytest.approx(4 * elements / 2)  # ring volume at 2 ranks, fp32
    assert f["allgather_bytes_per_step"] == pytest.approx(2 * 4 * elements / 2)  # gathered in forward and backward
    exposed = [row[7] for rank in s["phases"]["base"]["rank_steps"] for row in rank]
    assert exposed and all(math.isfinite(x) and x >= 0 for x in exposed) and max(exposed) > 0


@pytest.mark.full  # its parts in make test: the test above, tests/lab/test_accounting.py
@pytest.mark.timeout(600)
def test_the_doctor_measures_a_script_s_fsdp_exchange_and_advises_in_its_terms(tmp_path):
    out = tmp_path / "doc"
    r = run_cli(["doctor", "--nproc", "2", "--quick", "--cycles", "4", "--phase-steps", "6", "--out", str(out), "--",
                 "torchrun", "--nproc-per-node", "2", str(SCRIPTS / "ddp_train.py"), "--fsdp", "--width", "256",
                 "--steps", "100000"], timeout=580)
    assert r.rc == 0, r.err[-3000:]
    doc = read_json(out / "doctor.json")
    comm = next(c for c in doc["causes"] if c["name"] == "communication")
    assert comm["evidence"].startswith("FSDP over 3 unit(s): all-gather 0.34 MB"), comm["evidence"]
    assert "fully_shard(block, reshard_after_forward=False)" in comm["suggestion"] and not comm["apply_flags"]

    def exposed(k):  # the median measured wait in collectives of rank 0's no_data steps, at k processes
        s = read_json(next((out / "runs").glob(f"phases_n{k}_r*.json")))
        return statistics.median(row[7] for row in s["phases"]["no_data"]["rank_steps"][0])
    assert exposed(2) > exposed(1) >= 0
    assert comm["significant"] or next(c for c in doc["causes"] if c["name"] == "cpu_contention")["significant"]
    assert "no_comm not run: FSDP (fully_shard)" in " ".join((out / "doctor.md").read_text().split())
