"""``trainscale plan`` against published scaling tables, forecast from one-device figures and datasheets only.

Reads the frozen table ``tests/sim/heldout_scaling.json`` (sources, figures, assumptions), forecasts every point
with ``trainscale.costs.published`` and prints each point's published efficiency, the forecast and the error
(forecast - published, in efficiency points: every point of the table publishes an efficiency or a throughput
ratio at the same per-device work, which is one). ``--fit`` refits the framework overhead on the calibration
points only and says whether ``sim/catalog.json`` holds that fit. ``--plot`` draws forecast against published.
Output contract: the last stdout line is one JSON object with ``mean_abs_error``, ``max_abs_error`` and
``points`` (over the held-out points; the calibration points are reported apart).

    PYTHONPATH=src python benchmarks/plan_heldout.py [--fit] [--plot docs/plan-heldout.png]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trainscale.costs.hardware import catalog
from trainscale.costs.published import Row, evaluate, fit_constants

TABLE = Path(__file__).resolve().parents[1] / "tests" / "sim" / "heldout_scaling.json"


def _print_rows(rows: list[Row]) -> None:
    print(f"{'point':48s} {'role':11s} {'published':>9s} {'forecast':>8s} {'error':>7s}  known gap")
    for r in rows:
        gap = (r.known_gap[:90] + "...") if len(r.known_gap) > 90 else r.known_gap
        print(f"{r.id:48s} {r.role:11s} {r.published:9.3f} {r.forecast:8.3f} {r.error:+7.3f}  {gap}")


def _plot(rows: list[Row], path: Path) -> None:
    """Forecast against published efficiency, calibration and held-out points apart, with the +-0.05 band."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 5.0), dpi=110)
    lo = min(min(r.published, r.forecast) for r in rows) - 0.02
    ax.plot([lo, 1.0], [lo, 1.0], color="gray", lw=1, label="forecast = published")
    ax.fill_between([lo, 1.0], [lo - 0.05, 0.95], [lo + 0.05, 1.05], color="gray", alpha=0.12, label="+-0.05")
    families = {"dle": "NVIDIA DeepLearningExamples (1 vs 8 GPUs)", "horovod": "Horovod paper (512 GPUs)",
                "goyal2017": "Goyal et al. 2017 (256 vs 8)", "torchtitan": "torchtitan Llama 3.1 8B FSDP (128 vs 8)",
                "trainy": "torchtitan/Trainy H200 (64 vs 32)"}
    for prefix, label in families.items():
        for role, marker in (("held_out", "o"), ("calibration", "s")):
            sel = [r for r in rows if r.id.startswith(prefix) and r.role == role]
            if sel:
                ax.scatter([r.published for r in sel], [r.forecast for r in sel], marker=marker, s=28,
                           facecolors="none" if role == "calibration" else None,
                           label=f"{label}{', calibration' if role == 'calibration' else ''}",
                           color=f"C{list(families).index(prefix)}")
    ax.set(xlim=(lo, 1.0), ylim=(lo, 1.02), xlabel="published scaling efficiency",
           ylabel="forecast (one-device figure + datasheets)", title="trainscale plan on published tables")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _summary(rows: list[Row], constants: dict[str, float]) -> dict[str, Any]:
    held = [abs(r.error) for r in rows if r.role == "held_out"]
    cal = [abs(r.error) for r in rows if r.role == "calibration"]
    worst = max((r for r in rows if r.role == "held_out"), key=lambda r: abs(r.error))
    return {"mean_abs_error": round(sum(held) / len(held), 4), "max_abs_error": round(max(held), 4),
            "points": len(held), "error_unit": "efficiency points (forecast - published), held-out points only",
            "calibration_points": len(cal), "calibration_mean_abs_error": round(sum(cal) / len(cal), 4),
            "known_gaps": sum(bool(r.known_gap) for r in rows), "worst": worst.id, "constants": constants}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", type=Path, default=TABLE, help="the held-out table (default tests/sim/heldout_scaling.json)")
    p.add_argument("--fit", action="store_true", help="refit the framework overhead on the calibration points only "
                                                      "and compare with sim/catalog.json (exit 1 if they differ)")
    p.add_argument("--plot", type=Path, help="write forecast against published as a PNG")
    a = p.parse_args()
    points = json.loads(a.table.read_text())["points"]
    stored = {k: v for k, v in catalog()["framework_overhead"].items() if k != "source"}
    if a.fit:
        fitted = fit_constants(points)
        print(f"fitted on {sum(x['role'] == 'calibration' for x in points)} calibration points: {fitted}; "
              f"sim/catalog.json framework_overhead: {stored}" + ("" if fitted == stored else "  <- differs"))
        if fitted != stored:
            return 1
    rows = evaluate(points)
    _print_rows(rows)
    if a.plot:
        _plot(rows, a.plot)
        print(f"wrote {a.plot}")
    print(json.dumps(_summary(rows, stored)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
