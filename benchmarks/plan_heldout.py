"""``trainscale plan`` against published scaling tables, scored leave-one-source-out.

Reads ``tests/sim/heldout_scaling.json`` (every point: its source, table, URL, the inputs as the source states them
and every assumption). The planner's only fitted quantities are the noise, reducer and epoch-overhead terms of
``trainscale.costs.scale`` (units: s/s, seconds, passes over the gradient bytes, CPU seconds per epoch); for each source
in turn they are fitted on every other source and that source is forecast with them. Prints every point (published
efficiency, forecast, error = forecast - published in efficiency points), the per-source table and the overall mean
and max absolute error. ``--fit`` fits the terms on all sources and says whether ``costs/catalog.json`` holds that fit (exit 1 if
not); ``--plot`` draws forecast against published, one colour per source. Output contract: the last stdout line is
one JSON object with ``mean_abs_error``, ``max_abs_error``, ``points``, ``sources`` and ``per_source``.

    PYTHONPATH=src python benchmarks/plan_heldout.py [--fit] [--plot docs/plan-heldout.png]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trainscale.costs.hardware import catalog
from trainscale.costs.published import Row, fit_terms, leave_one_source_out

TABLE = Path(__file__).resolve().parents[1] / "tests" / "sim" / "heldout_scaling.json"


def _short(source: str) -> str:
    """A source's short name for tables: the last two parts of its URL."""
    return "/".join(source.rstrip("/").split("/")[-2:])


def per_source(rows: list[Row]) -> dict[str, dict[str, Any]]:
    """Per source: points, mean and max absolute error (efficiency points), the terms fitted without it."""
    out: dict[str, dict[str, Any]] = {}
    for src in dict.fromkeys(r.source for r in rows):
        errs = [abs(r.error) for r in rows if r.source == src and r.scored]
        t = next(r.terms for r in rows if r.source == src)
        out[src] = {"points": len(errs), "mean_abs_error": round(100 * sum(errs) / len(errs), 2),
                    "max_abs_error": round(100 * max(errs), 2),
                    "fitted_without_it": {"spread": t.spread, "host_jitter_ms": round(t.host_jitter_s * 1e3, 2),
                                          "reducer_passes": t.reducer_passes, "epoch_cpu_s": t.epoch_cpu_s}}
    return out


def _print(rows: list[Row], table: dict[str, dict[str, Any]]) -> None:
    print(f"{'point':48s} {'published':>9s} {'forecast':>8s} {'error':>7s}")
    for r in rows:
        print(f"{r.id:48s} {r.published:9.3f} {r.forecast:8.3f} {100 * r.error:+7.1f}" + ("" if r.scored else "  not scored"))
    print("\n| source | points | mean abs error | max abs error | terms fitted without it |\n|---|---:|---:|---:|---|")
    for src, s in table.items():
        f = s["fitted_without_it"]
        print(f"| {_short(src)} | {s['points']} | {s['mean_abs_error']:.2f} | {s['max_abs_error']:.2f} | "
              f"spread {f['spread']:g}, host jitter {f['host_jitter_ms']:g} ms, reducer {f['reducer_passes']:g} passes, "
              f"epoch {f['epoch_cpu_s']:g} CPU s |")


def _plot(rows: list[Row], path: Path) -> None:
    """Forecast against published efficiency, one colour per source (x: not scored), with the +-0.03 band."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 5.5), dpi=110)
    lo = min(min(r.published, r.forecast) for r in rows) - 0.02
    ax.plot([lo, 1.0], [lo, 1.0], color="gray", lw=1, label="forecast = published")
    ax.fill_between([lo, 1.0], [lo - 0.03, 0.97], [lo + 0.03, 1.03], color="gray", alpha=0.12, label="+-3 points")
    for i, src in enumerate(dict.fromkeys(r.source for r in rows)):
        sel = [r for r in rows if r.source == src and r.scored]
        ax.scatter([r.published for r in sel], [r.forecast for r in sel], s=24, color=f"C{i % 10}",
                   marker="os^"[i // 10], label=_short(src))
        off = [r for r in rows if r.source == src and not r.scored]
        if off:
            ax.scatter([r.published for r in off], [r.forecast for r in off], s=30, color=f"C{i % 10}", marker="x",
                       label=f"{_short(src)}, not scored")
    ax.set(xlim=(lo, 1.0), ylim=(lo, 1.02), xlabel="published scaling efficiency",
           ylabel="forecast, its source left out of the fit", title="trainscale plan, leave one source out")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _check_fit(points: list[dict[str, Any]]) -> bool:
    """Fit the terms on every source and compare with the catalogue's ``scale_terms``."""
    t = fit_terms(points)
    stored = catalog()["scale_terms"]
    fitted = {"spread": t.spread, "host_jitter_s": t.host_jitter_s, "reducer_passes": t.reducer_passes,
              "epoch_cpu_s": t.epoch_cpu_s}
    same = all(abs(fitted[k] - float(stored[k]["value"])) < 1e-12 for k in fitted)
    print(f"fitted on all {len({p['source']['url'].split('#')[0] for p in points})} sources: {fitted}; "
          f"costs/catalog.json scale_terms: { {k: stored[k]['value'] for k in fitted} }" + ("" if same else "  <- differs"))
    return same


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", type=Path, default=TABLE, help="the published table (default tests/sim/heldout_scaling.json)")
    p.add_argument("--fit", action="store_true", help="fit on all sources and compare with costs/catalog.json")
    p.add_argument("--plot", type=Path, help="write forecast against published as a PNG")
    a = p.parse_args()
    points = json.loads(a.table.read_text())["points"]
    if a.fit and not _check_fit(points):
        return 1
    rows = leave_one_source_out(points)
    table = per_source(rows)
    _print(rows, table)
    if a.plot:
        _plot(rows, a.plot)
        print(f"wrote {a.plot}")
    scored = [r for r in rows if r.scored]
    errs, every = [abs(r.error) for r in scored], [abs(r.error) for r in rows]
    worst = max(scored, key=lambda r: abs(r.error))
    print(json.dumps({"mean_abs_error": round(100 * sum(errs) / len(errs), 2), "max_abs_error": round(100 * max(errs), 2),
                      "points": len(scored), "sources": len(table), "worst": worst.id,
                      "not_scored": [r.id for r in rows if not r.scored],
                      "with_not_scored": {"mean_abs_error": round(100 * sum(every) / len(every), 2),
                                          "max_abs_error": round(100 * max(every), 2)},
                      "error_unit": "efficiency points (forecast - published), each source forecast with terms fitted "
                                    "on the others", "per_source": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
