"""CLI polish: grouped --help, "did you mean" for a misspelled field, trainscale env."""

from __future__ import annotations

import json

import pytest

from clitools import run_cli


def test_help_groups_fields_by_section():
    from trainscale.train.cli import _parser

    text = _parser().format_help()
    for section in ("[job]", "[data]", "[strategy]", "[log]", "[ablate]"):
        assert section in text
    strategy = text.split("[strategy]", 1)[1].split("\n[", 1)[0]
    assert "--strategy.bucket_mb VALUE" in strategy and "default 25.0" in strategy
    assert text.index("[strategy]") < text.index("--strategy.overlap") < text.index("[checkpoint]")


def test_misspelled_field_says_did_you_mean():
    from trainscale.config import ConfigError
    from trainscale.train.cli import parse

    with pytest.raises(ConfigError, match=r"did you mean strategy\.bucket_mb\?"):
        parse(["--strategy.bucket_mbb", "1"])
    with pytest.raises(ConfigError, match=r"unknown field of \[log\]; fields are"):
        parse(["--log.zzzz", "1"])  # nothing close: no guess
    _, cfg = parse(["--strategy.bucket_mb=3", "--log.timeline", "true", "--timeline"])
    assert cfg.strategy.bucket_mb == 3.0 and cfg.log.timeline


def test_misspelled_field_one_line_exit_2(capsys):
    from trainscale.cli import main

    assert main(["train", "--strategy.bucket_mbb", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainscale train: strategy.bucket_mbb = '1': unknown field of "
                                               "[strategy]; did you mean strategy.bucket_mb? fields are name, ")


def test_unknown_tracker_package_is_one_line(monkeypatch):
    import importlib.util

    from trainscale.config import ConfigError
    from trainscale.train.report.trackers import check_tracker

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"log.tracker = 'wandb': needs the wandb package: pip install"):
        check_tracker("wandb")


def test_env_command_reports_versions_and_machine():
    r = run_cli(["env", "--json"], timeout=90)
    assert r.rc == 0, r.text
    info = json.loads(r.out)
    assert info["versions"]["torch"] and info["versions"]["python"] and info["cpu_count"] >= 1
    assert info["backends"]["gloo"] is True and "dev_shm_bytes" in info



def test_env_table(capsys):
    from trainscale.about import main

    assert main([]) == 0
    out = capsys.readouterr().out
    assert "/dev/shm" in out and "torch" in out and "cores" in out
