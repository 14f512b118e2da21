"""The pipeline bubble measured against the schedule's theory for M = 1, 2, 4, 8 micro-batches.

Output contract: the last stdout line is one json object.

2 processes, 2 balanced stages of ``trainscale.models.planted:balanced`` (4 layers whose forward sleeps
--us microseconds per sample, backward twice that: device time emulated, so the 2 cores do not
dominate), batch 32, GPipe and 1F1B. The measured bubble is each stage's idle share of the
schedule's wall time (1 - its compute / step), averaged over the stages; the theory is
(S - 1) / (M + S - 1) from ``trainscale.costs.step.pipeline_bubble``. Writes a table (markdown), the
numbers (JSON) and a plot into --out.
Run: python benchmarks/pipeline_bubble.py [--us 8000 --out benchmarks/results/raw/pipeline]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import emit, launch_runs

from pipeline import job, pipe

MICRO = (1, 2, 4, 8)
SCHEDULES = ("gpipe", "1f1b")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.plot(MICRO, [r["theory"] for r in rows if r["schedule"] == "gpipe"], "k--", label="theory (S-1)/(M+S-1)")
    for sched, mark in zip(SCHEDULES, "os"):
        mine = [r for r in rows if r["schedule"] == sched]
        ax.plot([r["microbatches"] for r in mine], [r["measured"] for r in mine], mark + "-", label=f"measured {sched}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(MICRO, [str(m) for m in MICRO])
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("idle fraction of a step")
    ax.set_title("2-stage pipeline bubble (balanced stages)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--us", type=int, default=8000, help="planted forward microseconds per sample per layer")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/raw/pipeline")
    a = ap.parse_args()
    # 1F1B needs at least as many micro-batches as stages: its row starts at M = 2.
    cases = [(f"{s}_m{m}", job("balanced", a.us, 32, a.steps, *pipe(2, m, s))) for m in MICRO for s in SCHEDULES
             if s == "gpipe" or m >= 2]
    runs = launch_runs(2, cases)
    rows = []
    for name, _ in cases:
        p = runs[name]["pipeline"]
        rows.append({"schedule": p["schedule"], "microbatches": p["microbatches"], "measured": p["bubble_measured"],
                     "theory": p["bubble_theory"], "rel_error": p["bubble_measured"] / p["bubble_theory"] - 1,
                     "step_s": p["step_s"], "stage_time_s": p["stage_time_s"], "imbalance": p["imbalance"]})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| schedule | M | measured idle | theory (S-1)/(M+S-1) | relative error | step (s) | stage imbalance |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['schedule']} | {r['microbatches']} | {r['measured']:.3f} | {r['theory']:.3f} | "
              f"{r['rel_error']:+.1%} | {r['step_s']:.3f} | {r['imbalance']:.3f} |" for r in rows]
    (out / "bubble.md").write_text("\n".join(lines) + "\n")
    (out / "bubble.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, out / "bubble.png")
    print("\n".join(lines))
    emit({"rows": rows, "max_abs_rel_error": max(abs(r["rel_error"]) for r in rows), "us_per_sample": a.us})


if __name__ == "__main__":
    main()
