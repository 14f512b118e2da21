"""Which part of the per-rank accounting costs the step: ``doctor_accounting.py``'s toggled chunks, in one
process, with one part of the accounting replaced.

Variants: ``full`` (as shipped: the training thread read every ``READ_EVERY_S`` and at each block's end);
``perstep`` (the training thread read at every step's end, as before 2026-11-26); ``empty`` (every seam a
no-op, the instrument still attached); ``noread`` (no reads at all: a placeholder row per step); ``noblock``
(no block reads of the other threads). Compare variants over several alternated runs: one run's ratio moves by
about 0.005-0.01 here. Last line: one JSON object with ``variant``, ``cpu_ratio`` and ``step_ratio`` (median over
ABBA groups of chunks, with their 90% bootstrap intervals) and the median CPU per step on and off.
Run: python benchmarks/doctor_accounting_parts.py [VARIANT] [--chunks 300 --device auto]
"""

from __future__ import annotations

import argparse
import statistics

from _common import emit
from doctor_accounting import JOB, group_ratios, median_interval, toggled_chunks

VARIANTS = ("full", "perstep", "empty", "noread", "noblock")


def patch(variant: str) -> None:
    """Replace one part of ``Accounting`` in this process (``full``: nothing)."""
    from trainscale.train.instruments import accounting
    from trainscale.train.instruments.accounting import Accounting

    if variant == "perstep":
        accounting.READ_EVERY_S = 0.0  # type: ignore[misc]
    elif variant == "noblock":
        Accounting.close_block = lambda self: None  # type: ignore[method-assign]
    elif variant == "empty":
        Accounting.step_done = lambda self, step, measured, t_prev: None  # type: ignore[method-assign]
        Accounting.step_called = lambda self, now: None  # type: ignore[method-assign]
        Accounting.last_runq_s = lambda self: float("nan")  # type: ignore[method-assign]
    elif variant == "noread":
        def placeholder(self, step, measured, t_prev):
            if measured:
                self._steps.append((0, 0, 0.0, 0.0))
            self._block_steps += 1
        Accounting.step_done = placeholder  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variant", nargs="?", default="full", choices=VARIANTS, help="default: full")
    ap.add_argument("--chunks", type=int, default=300, help="chunks of 24 steps in the toggled run (half of them on)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="the job's --job.device")
    a = ap.parse_args()
    patch(a.variant)
    out = toggled_chunks(a.chunks, JOB + ["--job.device", a.device])
    result: dict[str, object] = {"variant": a.variant, "chunks": a.chunks, "device": a.device}
    for name, on, off in (("cpu_ratio", "cpu_on", "cpu_off"), ("step_ratio", "on", "off")):
        ratios = group_ratios({"on": out[on], "off": out[off]})
        result[name] = round(statistics.median(ratios), 4)
        result[f"{name}_ci90"] = [round(x, 4) for x in median_interval(ratios)]
    result["cpu_on_us"] = round(statistics.median(out["cpu_on"]) * 1e6, 1)
    result["cpu_off_us"] = round(statistics.median(out["cpu_off"]) * 1e6, 1)
    emit(result)


if __name__ == "__main__":
    main()
