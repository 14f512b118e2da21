"""Which part of the per-rank accounting costs the step: ``doctor_accounting.py``'s toggled chunks, in one
process, with one part of the accounting replaced.

Variants: ``full`` (as shipped); ``empty`` (every seam a no-op, the instrument still attached); ``noread`` (no
reads at all); ``noarrival`` (the per-step read without the arrival and exchange wait);
``clock`` (the read replaced by ``time.thread_time_ns``, which keeps the GIL); ``noblock`` (no block reads).
Prints one line: the median on/off ratio over chunk pairs of the training thread's CPU and of the step.
Run: python benchmarks/doctor_accounting_parts.py VARIANT [CHUNKS]
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import doctor_accounting as da  # noqa: E402

from trainscale.train.instruments import accounting as A  # noqa: E402

variant = sys.argv[1]
chunks = int(sys.argv[2]) if len(sys.argv) > 2 else 200
if variant == "noblock":
    A.Accounting.close_block = lambda self: None
elif variant == "noread":  # a placeholder row per step: no read at all, of this thread or the others
    def step_done(self, step, measured, t_prev):
        if measured:
            self._steps.append((0, 0, 0.0, 0.0))
        self._block_steps += 1
    A.Accounting.step_done = step_done
elif variant in ("clock", "noarrival"):
    import os
    import time

    def read(self):
        if variant == "clock":  # a clock call that keeps the GIL instead of the pread
            return time.thread_time_ns(), 0
        fields = os.pread(self._fd, 96, 0).split()
        return int(fields[0]), int(fields[1])

    def step_done(self, step, measured, t_prev):
        cpu, runq = read(self)
        if measured:
            arrival, comm = (self._arrival(t_prev) + self.offset, self._comm_wait()) if variant == "clock" else (0.0, 0.0)
            self._steps.append((cpu - self._cpu, runq - self._runq, arrival, comm))
            self._block_measured += 1
        self._cpu, self._runq = cpu, runq
        self._block_steps += 1
        if step >= self.warm and (step - self.warm) % self.block == 0:
            self.close_block()
    A.Accounting.step_done = step_done
elif variant == "empty":
    A.Accounting.step_done = lambda self, step, measured, t_prev: None
    A.Accounting.step_called = lambda self, now: None
    A.Accounting.last_runq_s = lambda self: float("nan")
out = da.toggled_chunks(chunks)
r = [a / b for a, b in zip(out["cpu_on"], out["cpu_off"])]
s = [a / b for a, b in zip(out["on"], out["off"])]
print(f"{variant} cpu_ratio {statistics.median(r):.4f} step_ratio {statistics.median(s):.4f} "
      f"cpu_off_us {statistics.median(out['cpu_off']) * 1e6:.1f} cpu_on_us {statistics.median(out['cpu_on']) * 1e6:.1f}",
      flush=True)
