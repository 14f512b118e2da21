"""The reports' verdicts: bench efficiency with its noise and the next command; doctor --apply adopt or not;
tables that align text left and numbers right."""

from __future__ import annotations

import pytest

from trainscale.lab.bench import complete_points
from trainscale.lab.verdict import adopt_verdict, bench_verdict


def _points(sps1, sps2, spread1, spread2, repeats=3):
    """Two points whose repeats lie evenly over median x (1 -/+ spread / 2)."""
    def runs(s, sp):
        return [s * (1 - sp / 2 + sp * i / (repeats - 1)) for i in range(repeats)] if repeats > 1 else [s]
    pts = [{"nproc": n, "world_size": n, "repeats": repeats, "samples_per_s": s, "spread": sp, "step_time_s": 1 / s,
            "step_time_spread": 0.2, "measured_steps": 40, "samples_per_s_runs": runs(s, sp)}
           for n, s, sp in ((1, sps1, spread1), (2, sps2, spread2))]
    return complete_points(pts, "weak")


def test_noise_larger_than_the_loss_is_inconclusive():
    # The case: 50.8% efficiency while the 1-process spread over repeats is 54.7%... and more noise at 2.
    v = bench_verdict(_points(1000.0, 1016.0, 1.2, 0.10), ["--model", "mlp"])
    assert v["word"] == "inconclusive" and "raise --repeat or --steps" in v["line"]
    assert v["range"][0] < 0.508 < 1.0 < v["range"][1]
    assert v["line"].startswith("Efficiency at 2 processes: 51% ± ")


def test_clear_loss_is_significant_and_names_the_doctor_command():
    v = bench_verdict(_points(1000.0, 1200.0, 0.03, 0.04), ["--model", "resnet18", "--steps", "60"])
    assert v["word"] == "significant"
    assert v["doctor_command"] == "trainscale doctor --nproc 2 --model resnet18 --steps 60"
    assert v["doctor_command"] in v["line"] and "40% of ideal throughput lost" in v["line"]


def test_single_run_points_use_the_runs_own_noise_and_say_so():
    v = bench_verdict(_points(1000.0, 1200.0, 0.0, 0.0, repeats=1), [], ["python", "train.py"])
    assert "one run per point" in v["line"] and v["doctor_command"].endswith("-- python train.py")
    assert bench_verdict(_points(1000.0, 1200.0, 0.0, 0.0)[:1], []) is None


def _phased(step_s, noise, repeats=3, cycles=6, seed=0):
    """Base-phase parts of ``repeats`` runs: 2 ranks, 4 steps per cycle, steps spread +-``noise`` around step_s."""
    import random
    import statistics

    rng = random.Random(seed)
    parts = []
    for _ in range(repeats):
        rows = [[[c, step_s * (1 + noise * (2 * rng.random() - 1)), 0.5 * step_s, 0.0] for c in range(cycles)
                 for _ in range(4)] for _ in range(2)]
        med = [statistics.median(r[1] for r in rank) for rank in rows]
        parts.append({"global_batch": 64, "step_time_s": med[0], "rank_step_time_s": med,
                      "rank_compute_s": [0.5 * step_s] * 2, "rank_steps": rows})
    return parts


def test_apply_adopts_a_gain_above_the_noise_only():
    faster = adopt_verdict(_phased(0.010, 0.2), _phased(0.005, 0.2, seed=1))
    assert faster["decision"] == "adopt" and faster["interval"][0] > 0
    assert faster["gain"] > 0.5 and faster["line"].endswith(": adopt")
    # 1% faster with steps +-30% apart: within the noise, not adopted (no fixed threshold decides it).
    same = adopt_verdict(_phased(0.010, 0.3), _phased(0.0099, 0.3, seed=1))
    assert same["decision"] == "do not adopt" and same["interval"][0] < 0 < same["interval"][1]
    assert "within the measured noise" in same["line"]
    slower = adopt_verdict(_phased(0.010, 0.05), _phased(0.014, 0.05, seed=1))
    assert slower["decision"] == "do not adopt" and slower["interval"][1] < 0 and "slower" in slower["line"]
    # The same 1% gain with quiet steps is above the noise.
    quiet = adopt_verdict(_phased(0.010, 0.002), _phased(0.0099, 0.002, seed=1))
    assert quiet["decision"] == "adopt"


def test_apply_judges_throughput_over_every_step_not_the_median_step():
    """Local SGD's shape: 3 fast steps and 1 slow one in 4. The median step halves, the throughput does not."""
    before = _phased(0.010, 0.0)
    after = _phased(0.005, 0.0)
    for part in after:
        for rank in part["rank_steps"]:
            for i, row in enumerate(rank):
                row[1] = 0.005 if i % 4 else 0.040  # the exchange, once every 4 steps
    v = adopt_verdict(before, after)
    assert v["gain"] == pytest.approx(4 * 0.010 / (3 * 0.005 + 0.040) - 1)  # -27%, though the median step halved
    assert v["decision"] == "do not adopt" and "slower" in v["line"]


def test_report_tables_align_text_left_and_numbers_right(tmp_path):
    from trainscale.reporting.render import render_html, render_markdown

    blocks = [("table", ["cause", "ms/step", "interval", "evidence"],
               [["input", "+3.20", "+1.00 .. +5.50", "data wait 2% of the step"], ["straggler", "-", "-", "none"]])]
    md = render_markdown("t", blocks)
    assert "|:--|--:|--:|:--|" in md
    page = render_html("t", blocks, tmp_path)
    assert "<td>input</td><td class=\"num\">+3.20</td>" in page and "<td>data wait 2% of the step</td>" in page


def test_a_clear_cause_of_a_superlinear_job_has_no_nan_share():
    # The slow-collate case scales superlinearly (efficiency 1.27): a clear cause has no loss to take a share of.
    from trainscale.lab.doctor_report import _scaling_headline

    top = {"name": "communication", "significant": True, "seconds_per_step": 0.00326, "share": float("nan"),
           "interval_s": [0.0026, 0.00457], "verdict": "clear", "evidence": "1 all-reduce call(s) per step",
           "apply_flags": {}, "suggestion": "send less"}
    line = _scaling_headline({"causes": [top], "efficiency": 1.27, "scaling_loss_s": -0.004})[0][1]
    assert "nan" not in line and "with no scaling loss to share (efficiency 127%)" in line
