"""The doctor's accounting rules on a real run's per-step series: a memory-bandwidth neighbour on one core.

The fixture is one doctor run of ``benchmarks/campaigns/doctor_cases.py membw`` (2 processes, resnet18 width 8 beside a
numpy loop copying 64 MB arrays pinned to core 1), its phased and sleep-test runs as the analysis reads them.
The analysis of the wave before the accounting named no clear cause (``external_load`` undecided at 17.2 ms)
and its causes summed to 40.6 ms of a 50.7 ms loss without saying so; these tests fail on it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from trainscale.lab.advice.suggest import context_from_config
from trainscale.lab.analysis import analyse
from trainscale.lab.invariants import ADDITIVE, violations
from trainscale.train.cli import parse

FIXTURE = Path(__file__).parent / "data" / "membw_doctor_runs.json.gz"


@pytest.fixture(scope="module")
def result():
    fix = json.loads(gzip.open(FIXTURE).read())
    runs = {(k.split("|")[0], int(k.split("|")[1])): v for k, v in fix["runs"].items()}
    ctx = {**context_from_config(parse(fix["train_args"])[1]), "external": fix["external"]}
    return analyse(runs, fix["nproc"], ctx, replicates=200)


def test_the_first_clear_cause_is_the_cpu_not_the_exchange_or_the_input(result):
    top = next(c for c in result["causes"] if c["verdict"] == "clear")
    assert top["name"] == "cpu_contention", result["causes"][:3]
    assert result["bottleneck"]["name"] not in ("communication", "input")


def test_every_estimate_lies_inside_its_interval(result):
    for c in result["causes"]:
        lo, hi = c["interval_s"]
        assert lo <= c["seconds_per_step"] <= hi, c["name"]


def test_the_causes_and_the_unexplained_rest_add_up_to_the_loss(result):
    total = sum(c["seconds_per_step"] for c in result["causes"] if c["name"] in ADDITIVE)
    assert total + result["unexplained_s"] == pytest.approx(result["scaling_loss_s"], abs=1e-12)
    assert result["invariants"] == [] and violations(result) == []


def test_what_moved_into_cpu_contention_is_written_in_both_rows(result):
    by = {c["name"]: c for c in result["causes"]}
    moved = by["cpu_contention"]["moved_from"]
    assert moved, "the measured CPU wait came out of at least one modelled cause"
    for m in moved:
        back = [x for x in by[m["cause"]]["moved_to"] if x["cause"] == "cpu_contention"]
        assert back and back[0]["s"] == m["s"] and "cpu_contention" in by[m["cause"]]["evidence"]
