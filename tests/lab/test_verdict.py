"""The bench report's verdict line: efficiency, its noise, significant or inconclusive, the next command."""

from __future__ import annotations

from trainscale.lab.bench import complete_points
from trainscale.lab.verdict import bench_verdict


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
