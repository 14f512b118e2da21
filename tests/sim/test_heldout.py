"""The planner against the frozen table of published scaling results (tests/sim/heldout_scaling.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainscale.costs.fsdp import FsdpUnit, fsdp_step
from trainscale.costs.hardware import catalog
from trainscale.costs.published import evaluate, fit_constants

TABLE = json.loads((Path(__file__).parent / "heldout_scaling.json").read_text())
POINTS = TABLE["points"]
# What a point's setting may give the forecast: one device's figure and datasheet-class numbers, never a
# multi-device figure of the same source.
SETTING_KEYS = {"kind", "gpu", "gpus_per_node", "intra", "inter", "params", "model", "batch_size", "samples_per_s_1",
                "precision", "bucket_mb", "hierarchical", "linear_precision", "mfu", "gather_bytes", "reduce_bytes",
                "layers", "layer_params", "root_params", "tokens_per_step", "linear_flops_per_token",
                "attention_flops_per_token", "head_flops_per_token"}


def test_the_table_states_its_sources_and_assumptions():
    assert len(POINTS) >= 15 and len({p["id"] for p in POINTS}) == len(POINTS)
    for p in POINTS:
        assert {"title", "table", "url"} <= set(p["source"]) and p["source"]["url"].startswith("https://"), p["id"]
        assert p["confidence"] and p["assumptions"], p["id"]
        assert p["role"] in ("calibration", "held_out") and 0 < p["published"]["efficiency"] <= 1, p["id"]
        assert set(p["model"]) <= SETTING_KEYS, (p["id"], set(p["model"]) - SETTING_KEYS)
    assert sum(p["role"] == "calibration" for p in POINTS) <= len(POINTS) / 3


def test_the_catalogue_constants_are_the_fit_on_calibration_points_only():
    stored = {k: v for k, v in catalog()["framework_overhead"].items() if k != "source"}
    assert fit_constants(POINTS) == stored
    # moving a held-out point does not move the constants
    moved = [dict(p, published={**p["published"], "efficiency": 0.5}) if p["role"] == "held_out" else p
             for p in POINTS]
    assert fit_constants(moved) == stored


def test_held_out_accuracy_and_known_gaps_keep_their_error():
    rows = evaluate(POINTS)
    held = [abs(r.error) for r in rows if r.role == "held_out"]
    assert sum(held) / len(held) <= 0.05 and max(held) <= 0.10
    for r, p in zip(rows, POINTS):
        if p.get("known_gap"):  # kept with its known error and reason, never tuned away
            assert r.error == pytest.approx(p["known_error"], abs=0.01), r.id
        else:
            assert abs(r.error) < 0.02, r.id  # a point drifting past 0.02 needs its reason written down


def test_fsdp_step_by_hand():
    # two units, 1 s forward + 2 s backward each, gathers of 0.5 s and reduce-scatters of 1 s (1 byte = 1 s)
    units = [FsdpUnit(0.5, 1.0, 2.0)] * 2
    t = fsdp_step(units, lambda n: n, lambda n: n, gather_bytes=1.0, reduce_bytes=2.0)
    # forward: gather 0.5 exposed, unit 1's gather hides under unit 0's compute: ends at 2.5;
    # backward: gather of unit 1 exposed (0.5), unit 0's gather hidden, unit 1's reduce (1 s) hidden under
    # unit 0's backward, unit 0's reduce (1 s) exposed at the end: 2.5 + 0.5 + 4 + 1 = 8.0
    assert t.compute_s == 6.0 and t.step_s == pytest.approx(8.0) and t.exposed_s == pytest.approx(2.0)
    assert t.comm_s == pytest.approx(2 * (2 * 0.5 + 1.0))
    # a link ten times slower hides almost nothing: it is busy 40 s of the 41 s step, in issue order
    slow = fsdp_step(units, lambda n: 10 * n, lambda n: 10 * n, gather_bytes=1.0, reduce_bytes=2.0)
    assert slow.comm_s == pytest.approx(40.0) and slow.step_s == pytest.approx(41.0)
