"""The timer of the frameworks' own collectives: what it counts, what it leaves out, and the compute it gives back."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from trainscale.inject.collectives import FUNCTIONS, CollectiveTimer
from trainscale.train.instruments import ComputeClock, StepMode


def _collective(seconds: float) -> None:
    time.sleep(seconds)  # stands for a rank blocked until the slowest one arrives


def test_a_call_is_timed_into_its_step_and_nested_or_own_calls_are_not():
    timer = CollectiveTimer()
    gather = timer.wrap(FUNCTIONS.index("all_gather"), _collective)
    outer = timer.wrap(FUNCTIONS.index("all_gather_object"), lambda: gather(0.0))  # calls all_gather inside
    own: dict = {"__name__": "trainscale.inject.agent", "gather": gather}
    exec("def broadcast_weights():\n    gather(0.0)\n", own)  # trainscale's own exchange: not the framework's

    gather(0.002)
    outer()
    own["broadcast_weights"]()
    assert timer.calls == 2 and timer.seconds >= 0.002
    assert timer.counts[FUNCTIONS.index("all_gather")] == 1 and timer.counts[FUNCTIONS.index("all_gather_object")] == 1


def test_only_measured_steps_are_kept_with_their_phase_and_cycle():
    timer, clock = CollectiveTimer(), ComputeClock(torch.device("cpu"))
    gather = timer.wrap(0, _collective)
    ins = SimpleNamespace(warm=1, clock=clock)  # the two fields of the run's Instruments the timer reads
    gather(0.0)
    timer.step_done(None, StepMode(), 0)  # the first iteration, before the instruments: warm-up
    gather(0.0)
    timer.step_done(ins, StepMode(), 1)  # still warm-up
    gather(0.001)
    gather(0.001)
    timer.step_done(ins, StepMode.of_phase("no_comm", True, 3), 2)
    assert [(p, c, n) for p, c, _, n in timer.rows] == [("no_comm", 3, 2)]
    assert timer.local()["by_function"] == {FUNCTIONS[0]: 2.0}
    steps = timer.local()["steps"]
    assert set(steps) == {None, "no_comm"} and steps["no_comm"][0][0] == 3.0


def test_a_wait_inside_forward_and_backward_is_not_compute():
    timer, clock = CollectiveTimer(), ComputeClock(torch.device("cpu"))
    timer.clock = clock
    gather = timer.wrap(0, _collective)
    clock.start()
    gather(0.02)
    clock._on_graph_done()  # the backward graph ends: the clock adds this forward+backward
    assert clock.spent < timer.seconds  # the 20 ms in the collective left out; what is left is the calls' own


def test_each_collective_keeps_the_users_line_that_led_to_it():
    """Seen on an untuned Lightning script: an all_reduce every step from `self.log(..., sync_dist=True)`; the
    timer keeps that line of the script and the framework's function between, not only "all_reduce x1"."""
    timer = CollectiveTimer()
    reduce = timer.wrap(FUNCTIONS.index("all_reduce"), _collective)
    lib = {"__name__": "lightning.pytorch.core.module", "reduce": reduce}
    exec(compile("def log(value, sync_dist=False):\n    reduce(0.0)\n",
                 "/venv/lib/python3.12/site-packages/lightning/pytorch/core/module.py", "exec"), lib)
    lib["log"](1.0, sync_dist=True)  # the user's line
    (site,) = timer.local()["sites"]
    assert site["function"] == "all_reduce" and site["where"].startswith("test_collectives.py:")
    assert 'lib["log"](1.0, sync_dist=True)' in site["code"]
    assert site["via"] == "lightning.pytorch.core.module.log" and site["calls"] == 1
