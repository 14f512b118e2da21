"""Combinations that cannot work are refused at start with one line: field, value, what is accepted."""

import pytest

from clitools import run_cli
from trainscale.config import ConfigError, load_config
from trainscale.strategies import check_strategy


def strategy(*args: str):
    return load_config(list(args)).strategy


@pytest.mark.parametrize("args,world,key,words", [
    (["--strategy.overlap", "false", "--strategy.compression", "fp16"], None, "strategy.compression", "overlap true"),
    (["--strategy.overlap", "false", "--strategy.local_sgd_period", "4"], None, "strategy.local_sgd_period",
     "overlap true"),
    (["--strategy.compression", "powersgd", "--strategy.hierarchical", "true"], None, "strategy.compression",
     "cannot be hierarchical"),
    (["--strategy.compression", "powersgd", "--strategy.comm_groups", "2"], None, "strategy.comm_groups", "one"),
    (["--strategy.local_sgd_period", "4", "--strategy.compression", "fp16"], None, "strategy.compression",
     "local SGD"),
    (["--strategy.local_sgd_period", "4", "--strategy.shard_optimizer", "true"], None, "strategy.shard_optimizer",
     "whole optimizer state"),
    (["--strategy.local_sgd_period", "4", "--strategy.bucket_mb", "auto"], None, "strategy.bucket_mb", "tune"),
    (["--strategy.local_size", "2"], 3, "strategy.local_size", "divide the world size 3"),
    (["--strategy.local_size", "8"], 4, "strategy.local_size", "divide"),
], ids=["overlap-hook", "overlap-local-sgd", "powersgd-hier", "powersgd-groups", "local-sgd-compression",
        "local-sgd-zero", "local-sgd-auto", "local-size-3", "local-size-big"])
def test_bad_combinations_are_refused(args, world, key, words):
    with pytest.raises(ConfigError) as e:
        check_strategy(strategy(*args), world, world)
    assert e.value.key == key and words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("args,key", [
    (["--strategy.powersgd_rank", "0"], "strategy.powersgd_rank"),
    (["--strategy.powersgd_warmup", "1"], "strategy.powersgd_warmup"),
    (["--strategy.comm_groups", "0"], "strategy.comm_groups"),
    (["--strategy.bucket_mb", "big"], "strategy.bucket_mb"),
    (["--strategy.bucket_candidates", "1,x"], "strategy.bucket_candidates"),
    (["--strategy.compression", "int8"], "strategy.compression"),
])
def test_bad_values_are_refused(args, key):
    with pytest.raises(ConfigError) as e:
        load_config(args)
    assert e.value.key == key


def test_good_combinations_pass():
    for args in (["--strategy.hierarchical", "true", "--strategy.compression", "fp16", "--strategy.comm_groups", "2"],
                 ["--strategy.local_sgd_period", "4", "--strategy.hierarchical", "true"],
                 ["--strategy.shard_optimizer", "true", "--strategy.compression", "powersgd"],
                 ["--strategy.bucket_mb", "auto", "--strategy.overlap", "false"]):
        check_strategy(strategy(*args), 4, 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,line", [
    (["--nproc", "3", "--strategy.hierarchical", "true", "--strategy.local_size", "2"],
     "trainscale train: strategy.local_size = 2: must divide the world size 3 (nodes of equal size)"),
    (["--nproc", "2", "--strategy.compression", "powersgd", "--strategy.powersgd_rank", "0"],
     "trainscale train: strategy.powersgd_rank = 0: must be a number >= 1 (the rank of the low-rank approximation)"),
], ids=["local-size", "powersgd-rank-0"])
def test_cli_refuses_before_launching(args, line):
    r = run_cli(["train", *args], timeout=50)
    assert r.rc == 2
    assert r.err.strip().splitlines() == [line]
    assert "Distributed environment" not in r.out  # no rank was started
