"""The step clock's process CPU per step: read every few steps (a read is a system call), never counting the work
between steps (warm-up, pauses, a script's own work after its loop)."""

from __future__ import annotations

import pytest

from trainscale.train.instruments import step_times
from trainscale.train.instruments.phases import StepMode
from trainscale.train.instruments.protocol import StepEnd
from trainscale.train.instruments.step_times import CPU_EVERY, StepTimes


class FakeCPU:
    """A process CPU clock that the test advances, counting its reads."""

    def __init__(self) -> None:
        self.now, self.reads = 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


@pytest.fixture
def cpu(monkeypatch):
    clock = FakeCPU()
    monkeypatch.setattr(step_times.time, "process_time", clock)
    return clock


def steps(times: StepTimes, cpu: FakeCPU, n: int, measured: bool = True, each: float = 1.0) -> None:
    for i in range(n):
        cpu.now += each
        times.on_step_end(StepEnd(i + 1, measured, 0.0, 0.01, 0.0, StepMode(), None))


def test_cpu_per_step_reads_the_clock_every_few_steps_and_skips_work_between_steps(cpu):
    times = StepTimes()
    steps(times, cpu, 3, measured=False, each=50.0)  # warm-up: not counted
    reads = cpu.reads
    steps(times, cpu, 2 * CPU_EVERY)
    assert cpu.reads - reads == 2  # one read per CPU_EVERY measured steps, none per step
    times.on_pause()
    cpu.now += 100.0  # an evaluation between steps
    times.on_resume()
    steps(times, cpu, CPU_EVERY, each=3.0)
    steps(times, cpu, 3)  # the last few steps, then the script's own work past its loop
    cpu.now += 100.0
    times.on_steps_end()
    assert times.cpu_per_step() == pytest.approx((2 * CPU_EVERY * 1.0 + CPU_EVERY * 3.0) / (3 * CPU_EVERY))
    assert len(times.step_times) == 3 * CPU_EVERY + 3  # every measured step is still timed


def test_a_run_shorter_than_one_read_still_has_its_cpu_per_step(cpu):
    times = StepTimes()
    steps(times, cpu, 1, measured=False, each=9.0)
    steps(times, cpu, 3, each=2.0)
    times.on_steps_end()
    assert times.cpu_per_step() == pytest.approx(2.0)
