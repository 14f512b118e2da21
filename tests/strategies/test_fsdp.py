"""FSDP2 (``strategy.fsdp``): the weights of DDP and of one process, through clipping, accumulation, activation
checkpointing and DCP resumes at 2 and 1 processes; its bytes and memory in the summary; what it refuses.

Two launches carry every training (``fsdp_job.py`` runs several phases on one process group): the suite's budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from strategies_common import ATOL, RTOL, assert_weights_close

from clitools import read_json, run_cli
from reference import one_process_sgd
from trainscale.config import ConfigError, load_config
from trainscale.models import build_model
from trainscale.strategies import check_strategy
from trainscale.strategies.fsdp import shard_units, unit_bytes

JOB = Path(__file__).parent / "fsdp_job.py"
# mlp width 32 on 8x8 digits: its three Linear layers are the units; dim 0 (32, 32, 10) splits evenly over 2.
UNIT_ELEMENTS = [64 * 32 + 32, 32 * 32 + 32, 32 * 10 + 10]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from trainscale.train.checkpoint.dcp import read_all
    if (folder / "last.pt").exists():
        return torch.load(folder / "last.pt", weights_only=True)["model"]
    return {k[len("model/"):]: v for k, v in read_all(folder / "last").items() if k.startswith("model/")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    for nproc, phases in ((2, "ddp,fsdp,fsdp_resumed,ddp_from_fsdp,fsdp_from_pt"), (1, "fsdp_resumed")):
        r = run_cli(["launch", "--nproc-per-node", str(nproc), str(JOB), str(out), phases], timeout=110)
        assert r.rc == 0, r.text[-3000:]
    return out


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_fsdp_equals_ddp_and_one_process_with_clipping_and_accumulation(runs):
    # fp32: the reduce-scatter sums in another order than DDP's all-reduce; measured max abs diff 3e-8.
    fsdp = _weights(runs / "fsdp-w2")
    assert_weights_close(fsdp, _weights(runs / "ddp-w2"), ATOL, RTOL, what="fsdp vs ddp")
    clipped = one_process_sgd(6, 16, 0.1, 32, clip=0.5)[0]
    assert_weights_close(fsdp, clipped, ATOL, RTOL, what="fsdp vs one process")
    unclipped = one_process_sgd(6, 16, 0.1, 32)[0]
    assert any(not torch.allclose(clipped[k], unclipped[k], atol=1e-4) for k in clipped)  # clipping engaged


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_fsdp_dcp_checkpoint_resumes_on_2_and_1_processes_and_into_ddp(runs):
    whole = _weights(runs / "fsdp-w2")
    for tag in ("fsdp_resumed-w2", "fsdp_resumed-w1"):
        assert read_json(runs / f"{tag}.json")["resumed_from_step"] == 3
        assert_weights_close(_weights(runs / tag), whole, ATOL, RTOL, what=tag)
    ddp = _weights(runs / "ddp-w2")
    assert_weights_close(_weights(runs / "ddp_from_fsdp-w2"), ddp, ATOL, RTOL, what="ddp from an fsdp checkpoint")
    # ddp's one-file checkpoint (momentum included) loads into fsdp, whose one-file checkpoint gathers the shards
    assert_weights_close(_weights(runs / "fsdp_from_pt-w2"), ddp, ATOL, RTOL, what="fsdp from a ddp .pt")


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_fsdp_summary_reports_its_bytes_and_peak_memory(runs):
    s, ddp = read_json(runs / "fsdp-w2.json"), read_json(runs / "ddp-w2.json")  # validated against the schema
    f, n, w = s["fsdp"], sum(UNIT_ELEMENTS) * 4, 2
    assert f["units"] == 3 and f["activation_checkpointing"] == 3
    # 2 micro-steps x (forward + backward gather of each unit) x N (W-1)/W; one reduce-scatter of N (W-1)/W
    assert f["allgather_bytes_per_step"] == 2 * 2 * n * (w - 1) / w
    assert f["reduce_scatter_bytes_per_step"] == n * (w - 1) / w
    assert s["comm_bytes_per_step"] == f["allgather_bytes_per_step"] + f["reduce_scatter_bytes_per_step"]
    assert s["allreduce_calls_per_step"] == 0
    assert s["optim_state_bytes"] == ddp["optim_state_bytes"] / 2  # momentum sharded: half on each rank
    assert len(s["peak_memory_bytes"]) == 2 and min(s["peak_memory_bytes"]) > 0
    assert s["peak_memory_measure"].startswith("cpu peak resident set")


def test_units_of_registry_models_and_by_name():
    mlp = build_model("mlp", (1, 8, 8), 10, width=32)
    assert [n for n, _ in shard_units(mlp, "")] == ["1", "3", "5"]  # an nn.Sequential's layers with parameters
    assert [n for n, _ in shard_units(mlp, "Linear")] == ["1", "3", "5"]
    assert [n for n, _ in shard_units(mlp, "3")] == ["3"]
    resnet = build_model("resnet18", (3, 32, 32), 10, width=8)
    names = [n for n, _ in shard_units(resnet, "")]
    assert names[0] == "stem" and len(names) == 1 + 8 and names[1] == "stages.0.0"  # the stem and every block
    assert len(shard_units(resnet, "BasicBlock")) == 8


def test_unit_bytes_pad_dim_0_to_equal_shards():
    mlp = build_model("mlp", (1, 8, 8), 9, width=32)  # the last layer's 9 rows pad to 10 over 2 ranks
    sizes = unit_bytes(mlp, shard_units(mlp, ""), 2)
    assert sizes == {"": 0, "1": UNIT_ELEMENTS[0], "3": UNIT_ELEMENTS[1], "5": 10 * 32 + 10}


def test_a_name_that_matches_no_module_is_refused_in_one_line():
    mlp = build_model("mlp", (1, 8, 8), 10, width=32)
    with pytest.raises(ConfigError) as e:
        shard_units(mlp, "Linear,Block")
    assert e.value.key == "strategy.fsdp_modules" and "'Block'" in str(e.value) and "Linear" in e.value.accepted
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("args,key,words", [
    (["--strategy.local_sgd_period", "4"], "strategy.local_sgd_period", "local SGD"),
    (["--strategy.compression", "fp16"], "strategy.compression", "communication hook"),
    (["--strategy.hierarchical", "true"], "strategy.hierarchical", "communication hook"),
    (["--strategy.comm_groups", "2"], "strategy.comm_groups", "communication hook"),
    (["--strategy.shard_optimizer", "true"], "strategy.shard_optimizer", "shards the optimizer state"),
    (["--strategy.pipeline_stages", "2"], "strategy.pipeline_stages", "pipeline"),
    (["--strategy.overlap", "false"], "strategy.overlap", "reduce-scatters in backward"),
    (["--strategy.bucket_mb", "auto"], "strategy.bucket_mb", "no buckets"),
    (["--strategy.amp", "fp16"], "strategy.amp", "use bf16"),
], ids=["local-sgd", "compression", "hierarchical", "comm-groups", "zero", "pipeline", "overlap", "autotune",
        "fp16"])
def test_fsdp_refuses_what_needs_ddp(args, key, words):
    with pytest.raises(ConfigError) as e:
        check_strategy(load_config(["--strategy.fsdp", "true", *args]).strategy, 2, 2)
    assert e.value.key == key and words in str(e.value) and "strategy.fsdp true" in str(e.value)
    assert "\n" not in str(e.value)


def test_fsdp_fields_without_fsdp_and_experiments_under_fsdp_are_refused():
    with pytest.raises(ConfigError) as e:
        check_strategy(load_config(["--strategy.fsdp_param_dtype", "bf16"]).strategy, 2, 2)
    assert e.value.key == "strategy.fsdp_param_dtype" and "strategy.fsdp true" in str(e.value)
    for exp in (["--ablate.comm", "true"], ["--ablate.phases", "base,no_comm"]):
        with pytest.raises(ConfigError) as e:
            load_config(["--strategy.fsdp", "true", *exp])
        assert e.value.key == "strategy.fsdp" and "do not run under FSDP" in str(e.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,line", [
    (["--strategy.local_sgd_period", "4"],
     "trainscale train: strategy.local_sgd_period = 4: not with strategy.fsdp true (local SGD averages whole "
     "replicas, which FSDP does not keep); set 0"),
    (["--strategy.fsdp_modules", "Block"],
     "trainscale train: strategy.fsdp_modules = 'Block': no module of class or name 'Block' in Sequential; its "
     "classes with parameters: Linear"),
], ids=["local-sgd", "no-such-module"])
def test_cli_refuses_before_launching(args, line):
    r = run_cli(["train", "--nproc", "2", "--strategy.fsdp", "true", *args], timeout=50)
    assert r.rc == 2
    assert r.err.strip().splitlines() == [line]
    assert "Distributed environment" not in r.out  # no rank was started
