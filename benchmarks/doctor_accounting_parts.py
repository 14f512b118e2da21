"""Which part of the per-rank accounting costs the step: ``doctor_accounting.py``'s toggled chunks, in one
process, with one part of the accounting replaced.

Variants: ``full`` (as shipped); ``empty`` (every seam a no-op, the instrument still attached); ``noread`` (no
reads at all: a placeholder row per step); ``noarrival`` (the per-step read without the arrival and exchange
wait); ``clock`` (the read replaced by ``time.thread_time_ns``, which keeps the GIL); ``noblock`` (no block
reads of the other threads). The same code's ratio varies by about 0.025 from run to run on a 2-core VM
(``benchmarks/results/2026-11-25-doctor-accounting.md``): compare variants over several alternated runs.
Last line: one JSON object with ``variant``, ``cpu_ratio`` and ``step_ratio`` (median over adjacent on/off chunk
pairs, with their 90% bootstrap intervals) and the median CPU per step on and off.
Run: python benchmarks/doctor_accounting_parts.py VARIANT [--chunks 300 --device auto]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from _common import emit
from doctor_accounting import JOB, median_interval, pair_ratios, toggled_chunks

VARIANTS = ("full", "empty", "noread", "noarrival", "clock", "noblock")


def patch(variant: str) -> None:
    """Replace one part of ``Accounting`` in this process (``full``: nothing)."""
    from trainscale.train.instruments.accounting import Accounting

    if variant == "noblock":
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
    elif variant in ("clock", "noarrival"):
        def read(self):
            if variant == "clock":  # a clock call that keeps the GIL instead of the pread
                return time.thread_time_ns(), 0
            fields = os.pread(self._fd, 96, 0).split()
            return int(fields[0]), int(fields[1])

        def step_done(self, step, measured, t_prev):  # Accounting.step_done with ``read`` in place of the pread
            cpu, runq = read(self)
            if measured:
                arrival, comm = ((self._arrival(t_prev) + self.offset, self._comm_wait()) if variant == "clock"
                                 else (0.0, 0.0))
                self._steps.append((cpu - self._cpu, runq - self._runq, arrival, comm))
                self._block_measured += 1
            self._cpu, self._runq = cpu, runq
            self._block_steps += 1
            if step >= self.warm and (step - self.warm) % self.block == 0:
                self.close_block()
        Accounting.step_done = step_done  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variant", choices=VARIANTS)
    ap.add_argument("--chunks", type=int, default=300, help="chunks of 24 steps in the toggled run (half of them on)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="the job's --job.device")
    a = ap.parse_args()
    patch(a.variant)
    out = toggled_chunks(a.chunks, JOB + ["--job.device", a.device])
    result: dict[str, object] = {"variant": a.variant, "chunks": a.chunks, "device": a.device}
    for name, on, off in (("cpu_ratio", "cpu_on", "cpu_off"), ("step_ratio", "on", "off")):
        ratios = pair_ratios({"on": out[on], "off": out[off]})
        result[name] = round(statistics.median(ratios), 4)
        result[f"{name}_ci90"] = [round(x, 4) for x in median_interval(ratios)]
    result["cpu_on_us"] = round(statistics.median(out["cpu_on"]) * 1e6, 1)
    result["cpu_off_us"] = round(statistics.median(out["cpu_off"]) * 1e6, 1)
    emit(result)


if __name__ == "__main__":
    main()
