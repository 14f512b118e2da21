"""Bad pipeline input: one clear line naming the field, the value and what is accepted, before any process starts."""

import pytest

from clitools import run_cli
from trainscale.config import Config, ConfigError, load_config
from trainscale.lab.pipeline_analysis import pipeline_causes, pipeline_experiments
from trainscale.strategies import check_transport
from trainscale.train.cli import parse, preflight

PP = ["--strategy.pipeline_stages", "2"]


@pytest.mark.parametrize("args,key,words", [
    ([*PP, "--strategy.microbatches", "5"], "strategy.microbatches", "must divide data.batch_size = 32"),
    ([*PP, "--strategy.local_sgd_period", "4"], "strategy.local_sgd_period", "local SGD is not supported"),
    ([*PP, "--strategy.shard_optimizer", "true"], "strategy.shard_optimizer", "ZeRO is not supported"),
    ([*PP, "--strategy.hierarchical", "true"], "strategy.hierarchical", "not supported with pipelining"),
    ([*PP, "--strategy.compression", "powersgd"], "strategy.compression", "none, fp16 or bf16"),
    ([*PP, "--strategy.grad_accum", "2"], "strategy.grad_accum", "raise strategy.microbatches"),
    ([*PP, "--strategy.schedule", "zbv"], "strategy.stages_per_rank", "exactly 2"),
    ([*PP, "--strategy.schedule", "interleaved-1f1b"], "strategy.stages_per_rank", ">= 2"),
    ([*PP, "--ablate.phases", "base,no_comm"], "strategy.pipeline_stages", "do not run on pipelines"),
    (["--strategy.pipeline_stages", "0"], "strategy.pipeline_stages", ">= 1"),
    (["--strategy.schedule", "dualpipe"], "strategy.schedule", "one of gpipe, 1f1b, interleaved-1f1b, zbv"),
], ids=["microbatches", "local-sgd", "zero", "hierarchical", "powersgd", "grad-accum", "zbv", "interleaved",
        "ablate", "zero-stages", "schedule"])
def test_bad_pipeline_configs_are_refused(args, key, words):
    with pytest.raises(ConfigError) as e:
        load_config(args)
    assert e.value.key == key and words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("args,expected", [
    (["--nproc", "3", *PP], "strategy.pipeline_stages = 2: must divide the world size 3"),
    (["--nproc", "2", *PP, "--strategy.split", "3,5"], "strategy.split = '3,5': give 1 layer names"),
    (["--nproc", "2", *PP, "--strategy.split", "9"], "strategy.split = '9': no layer named '9'; layers are 1, 3, 5"),
], ids=["world", "split-count", "split-name"])
def test_preflight_refuses_what_needs_the_world_or_the_model(args, expected):
    parsed, cfg = parse(args)
    with pytest.raises(ConfigError) as e:
        preflight(parsed, cfg)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)
    preflight(*parse(["--nproc", "4", *PP, "--strategy.split", "5"]))  # 2 replicas x 2 stages, a good name


def test_a_pipeline_is_refused_where_gloo_would_send_cuda_tensors():
    """Gloo's send/recv cannot read CUDA memory (seen on an H100: "writev ... Bad address" at the first step)."""
    pp = load_config(PP).strategy
    with pytest.raises(ConfigError) as e:
        check_transport(pp, "cuda", "gloo")
    assert e.value.key == "strategy.pipeline_stages" and "--job.device cpu" in str(e.value)
    assert "\n" not in str(e.value)
    for device, backend in (("cuda", "nccl"), ("cpu", "gloo")):
        check_transport(pp, device, backend)
    check_transport(load_config([]).strategy, "cuda", "gloo")  # no pipeline: Gloo's collectives take CUDA tensors


@pytest.mark.timeout(90)
def test_cli_refuses_more_stages_than_layers_before_any_process_starts(tmp_path):
    out = tmp_path / "s.json"
    r = run_cli(["train", "--nproc", "4", "--strategy.pipeline_stages", "4", "--json", str(out)], timeout=80)
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert r.rc == 2 and len(lines) == 1, r.err
    assert lines[0] == ("trainscale train: strategy.pipeline_stages = 4: more stages (4 model chunks) than mlp's 3 "
                        "layers (1, 3, 5)")
    assert "Distributed environment" not in r.text and list(tmp_path.iterdir()) == []


def _summary(step: float, m: int, bubble: float, imb: float, bounds: list[str]) -> dict:
    return {"step_time_s": step, "pipeline": {"microbatches": m, "bubble_measured": bubble, "bubble_theory": 1 / (m + 1),
                                              "imbalance": imb, "split": "uniform", "boundaries": bounds,
                                              "stage_time_s": [0.3, 0.1]}}


def test_doctor_names_bubble_and_imbalance_by_experiment():
    cfg = load_config([*PP, "--strategy.microbatches", "2", "--strategy.split", "uniform"])
    assert pipeline_experiments(cfg) == {"base": [], "more_microbatches": ["--strategy.microbatches", "4"],
                                         "split_auto": ["--strategy.split", "auto"]}
    assert "split_auto" not in pipeline_experiments(Config())
    runs = {"base": [_summary(1.0, 2, 0.4, 1.5, ["1", "5"]), _summary(1.1, 2, 0.4, 1.5, ["1", "5"])],
            "more_microbatches": [_summary(0.8, 4, 0.25, 1.5, ["1", "5"]), _summary(0.85, 4, 0.25, 1.5, ["1", "5"])],
            "split_auto": [_summary(0.95, 2, 0.4, 1.1, ["1", "3"]), _summary(1.09, 2, 0.4, 1.1, ["1", "3"])]}
    causes = {c["name"]: c for c in pipeline_causes(runs, cfg)}
    bubble, imb = causes["pipeline_bubble"], causes["stage_imbalance"]
    assert bubble["verdict"] == "clear" and bubble["apply_flags"] == {"strategy.microbatches": "4"}
    assert bubble["seconds_per_step"] == pytest.approx(0.225)
    assert imb["verdict"] == "likely"  # one repeat saved under 5% of the step: not clear
    assert "--strategy.split auto" in imb["suggestion"] and "1.50" in imb["evidence"]
