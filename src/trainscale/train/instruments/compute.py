"""Per-rank compute timing, straggler injection and the sleep test (``--ablate.compute sleep``).

``ComputeClock`` times forward + backward of each step up to the moment the autograd graph is done,
which is *before* DDP's reducer waits for its all-reduces (its callback is queued later than ours),
so a rank that waits for a straggler does not look slow itself.

``SleepCompute`` is the sleep test, the decisive experiment of a scaling investigation: every leaf module's forward and backward are
timed for a few calibration steps, then replaced by sleeps of those durations. Gradients still flow
(zeros, of the right shapes), so DDP's hooks, buckets and all-reduces, the launcher and the loop
remain; only the compute, and the contention it causes, disappears.
"""

from __future__ import annotations

import json
import statistics
import time
import types
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...log import logger
from .protocol import Instrument, StepEnd

__all__ = ["ComputeClock", "SleepCompute", "SleepTest", "SlowRank", "leaf_modules"]


def _queue_callback(fn: Any) -> None:
    torch.autograd.Variable._execution_engine.queue_callback(fn)


class SlowRank(Instrument):
    """Fault injection (``job.slow_rank``): this rank's forward+backward made ``factor`` x slower by a sleep.

    The sleep runs as backward starts, before any gradient is ready, so DDP's all-reduces start late on this rank
    and the others wait for it inside them, as they would for a rank with more work: its last gradient (its
    arrival at the exchange) comes late, and its own wait in the exchange stays the exchange's. Its length is
    ``factor - 1`` times the rank's previous forward+backward without the sleep. Registered before the compute
    clock's own hook, so the clock measures the slowed time like any other compute. From step ``from_step`` on
    (1-based, counted from the run's start): the onset of a fault in the middle of a run.
    """

    __slots__ = ("factor", "t0", "from_step", "on", "last", "slept")

    def __init__(self, factor: float, from_step: int = 0):
        self.factor, self.t0, self.from_step = factor, 0.0, from_step
        self.on = from_step <= 1
        self.last = self.slept = 0.0  # the previous forward+backward without the sleep; this step's sleep

    def next_step(self, step: int) -> None:
        """Step ``step`` (1-based) comes next."""
        self.on = step >= self.from_step

    def start(self) -> None:
        """Mark the start of a micro-step's forward."""
        self.t0, self.slept = time.perf_counter(), 0.0

    def watch(self, loss: torch.Tensor) -> None:
        """Sleep as ``loss``'s backward starts, and time the graph without it (call before ``backward``)."""
        if loss.requires_grad:
            loss.register_hook(self._on_backward_start)

    def _on_backward_start(self, grad: torch.Tensor) -> None:
        _queue_callback(self._on_graph_done)
        if self.on and self.last > 0:
            t = time.perf_counter()
            time.sleep(self.last * (self.factor - 1.0))
            self.slept = time.perf_counter() - t

    def _on_graph_done(self) -> None:
        self.last = time.perf_counter() - self.t0 - self.slept

    def on_forward_start(self, t: float) -> None:
        self.start()

    def on_backward(self, scaled_loss: torch.Tensor) -> None:
        self.watch(scaled_loss)

    def on_step_end(self, end: StepEnd) -> None:
        self.next_step(end.step + 1)


class ComputeClock(Instrument):
    """Forward + backward seconds of each step on this rank (CUDA events on GPUs, no host sync)."""

    __slots__ = ("cuda", "t0", "spent", "times", "_pending", "_start_ev")

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.t0, self.spent = 0.0, 0.0
        self.times: list[Any] = []  # seconds per step; on CUDA each step's (start, end) events instead
        self._pending: list[tuple[Any, Any]] = []  # CUDA (start, end) events resolved at the end
        self._start_ev: Any = None

    def start(self) -> None:
        """Mark the start of a micro-step's forward."""
        self.t0 = time.perf_counter()
        if self.cuda:
            self._start_ev = torch.cuda.Event(enable_timing=True)
            self._start_ev.record()

    def watch(self, loss: torch.Tensor) -> None:
        """Arrange for the end of ``loss``'s backward graph to be timed (call before ``backward``)."""
        if loss.requires_grad:
            loss.register_hook(self._on_backward_start)

    def _on_backward_start(self, grad: torch.Tensor) -> None:
        _queue_callback(self._on_graph_done)  # runs before DDP's finalize, which waits on all-reduce

    def _on_graph_done(self) -> None:
        dt = time.perf_counter() - self.t0
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._start_ev, end))
        else:
            self.spent += dt

    def add(self, seconds: float) -> None:
        """Compute timed by its owner (a pipeline's stages time their own chunks, host time)."""
        self.spent += seconds

    def current(self) -> Any:
        """This step's compute so far: seconds, or on CUDA its (start, end) events (call before ``end_step``)."""
        return list(self._pending) if self.cuda else self.spent

    def end_step(self, keep: bool) -> None:
        """Close the step; ``keep`` says whether it is a measured one."""
        if self.cuda:
            if keep:
                self.times.append(self._pending)  # this step's (start, end) events, read at the end
            self._pending = []
        elif keep:
            self.times.append(self.spent)
        self.spent = 0.0

    def values(self) -> list[float]:
        """Compute seconds of each measured step (CUDA events are read here, after a sync)."""
        if not self.cuda:
            return list(self.times)
        torch.cuda.synchronize()
        return [sum(s.elapsed_time(e) for s, e in evs) / 1000.0 for evs in self.times]

    def on_forward_start(self, t: float) -> None:
        self.start()

    def on_backward(self, scaled_loss: torch.Tensor) -> None:
        self.watch(scaled_loss)

    def on_step_end(self, end: StepEnd) -> None:
        self.end_step(end.measured)


def leaf_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules without children: the units the sleep test replaces."""
    return [(n, m) for n, m in model.named_modules() if not any(True for _ in m.children())]


class _Sleeper:
    """Sleeps that add up to the requested total although one ``time.sleep`` overshoots by ~50 us."""

    __slots__ = ("overshoot", "debt")

    def __init__(self) -> None:
        samples = []
        for _ in range(20):
            t = time.perf_counter()
            time.sleep(1e-5)
            samples.append(time.perf_counter() - t - 1e-5)
        self.overshoot, self.debt = max(0.0, statistics.median(samples)), 0.0

    def __call__(self, seconds: float) -> None:
        # Short sleeps are owed and paid in one longer sleep; busy-waiting would bring back compute contention.
        self.debt += seconds
        if self.debt > self.overshoot:
            t = time.perf_counter()
            time.sleep(self.debt - self.overshoot)
            self.debt -= time.perf_counter() - t


class _SleepFn(torch.autograd.Function):
    """Forward: sleep, return a stored output. Backward: sleep, return zero gradients of the right shapes."""

    @staticmethod
    def forward(ctx: Any, rec: _CallRecord, sleeper: _Sleeper, *tensors: torch.Tensor) -> torch.Tensor:
        out = rec.output
        # An epoch's last batch may be smaller: sleep in proportion and return an output of its size.
        n = tensors[0].shape[0] if tensors and tensors[0].dim() and out.dim() else out.shape[0] if out.dim() else 1
        full = out.shape[0] if out.dim() else 1
        frac = n / full if full else 1.0
        sleeper(rec.fwd_s * frac)
        ctx.rec, ctx.sleeper, ctx.frac = rec, sleeper, frac
        ctx.metas = [(t.shape, t.dtype, t.device) for t in tensors]
        if n == full:
            return out.clone()
        return out[:n].clone() if n < full else out[:1].expand(n, *out.shape[1:]).clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        ctx.sleeper(ctx.rec.bwd_s * ctx.frac)
        grads = [torch.zeros(s, dtype=d, device=dev) if need else None
                 for (s, d, dev), need in zip(ctx.metas, ctx.needs_input_grad[2:])]
        return (None, None, *grads)


class _CallRecord:
    __slots__ = ("fwd_s", "bwd_s", "output")

    def __init__(self, fwd_s: float, bwd_s: float, output: torch.Tensor):
        self.fwd_s, self.bwd_s, self.output = fwd_s, bwd_s, output


class SleepCompute:
    """Calibrate per-leaf forward/backward durations, then replace the leaves' compute by sleeps."""

    def __init__(self, model: nn.Module, device: torch.device):
        self.model, self.cuda = model, device.type == "cuda"
        self.leaves = leaf_modules(model)
        self.handles: list[Any] = []
        # per step: list of (leaf index, call index) in forward order, fwd seconds, and backward events
        self.fwd: dict[tuple[int, int], list[float]] = {}
        self.bwd: dict[tuple[int, int], list[float]] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self._calls: list[int] = []
        self._events: list[tuple[float, tuple[int, int] | None]] = []
        self._t_pre = 0.0
        self.installed = False
        self.total_fwd_s = self.total_bwd_s = 0.0

    # -------------------------------------------------------------------------- calibration

    def start_calibration(self) -> None:
        """Hook every leaf module (forward timing and an output-gradient hook for backward timing)."""
        for i, (_, m) in enumerate(self.leaves):
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(lambda mod, inp, out, i=i: self._post(i, out)))
        self._calls = [0] * len(self.leaves)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()  # calibration only: per-module device time needs it

    def _pre(self, mod: nn.Module, inp: Any) -> None:
        self._sync()
        self._t_pre = time.perf_counter()

    def _post(self, i: int, out: Any) -> None:
        self._sync()
        key = (i, self._calls[i])
        self._calls[i] += 1
        self.fwd.setdefault(key, []).append(time.perf_counter() - self._t_pre)
        if torch.is_tensor(out):
            self.outputs[key] = out.detach().clone()
            if out.requires_grad:
                out.register_hook(lambda g, key=key: self._bwd_event(key))

    def _bwd_event(self, key: tuple[int, int]) -> None:
        self._sync()
        self._events.append((time.perf_counter(), key))

    def watch(self, loss: torch.Tensor) -> None:
        """Mark the end of the backward graph of ``loss`` (closes the last module's interval)."""
        if loss.requires_grad:
            loss.register_hook(lambda g: _queue_callback(self._graph_done))

    def _graph_done(self) -> None:
        self._sync()
        self._events.append((time.perf_counter(), None))

    def end_step(self) -> None:
        """One calibration step done: turn its backward events into per-module intervals."""
        ev = sorted(self._events)
        for (t, key), (t_next, _) in zip(ev, ev[1:]):
            if key is not None:
                self.bwd.setdefault(key, []).append(t_next - t)
        self._events.clear()
        self._calls = [0] * len(self.leaves)

    # -------------------------------------------------------------------------- replacement

    def export(self) -> dict[str, Any]:
        """The calibrated durations, per leaf module and call, for ``ablate.sleep_times`` of another run."""
        mods = []
        for i, (name, _) in enumerate(self.leaves):
            calls = []
            for c in range(max((k[1] + 1 for k in self.fwd if k[0] == i), default=0)):
                out = self.outputs.get((i, c))
                if out is None:
                    break
                calls.append({"fwd_s": statistics.median(self.fwd[(i, c)]),
                              "bwd_s": statistics.median(self.bwd.get((i, c), [0.0])),
                              "shape": list(out.shape), "dtype": str(out.dtype).replace("torch.", "")})
            mods.append({"name": name, "calls": calls})
        return {"modules": mods}

    def load(self, data: dict[str, Any], device: torch.device) -> None:
        """Take durations from an earlier calibration instead of measuring here, then install the sleeps."""
        index = {name: i for i, (name, _) in enumerate(self.leaves)}
        for m in data.get("modules", []):
            i = index.get(m["name"])
            if i is None:
                continue
            for c, call in enumerate(m["calls"]):
                key = (i, c)
                self.fwd[key], self.bwd[key] = [call["fwd_s"]], [call["bwd_s"]]
                self.outputs[key] = torch.zeros(call["shape"], dtype=getattr(torch, call["dtype"]), device=device)
        self.install()

    def uninstall(self) -> None:
        """Give every leaf its real forward back (evaluation and checkpoints use real compute)."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
        _uninstall(self.leaves)

    def install(self) -> None:
        """Remove the calibration hooks and replace each leaf's forward by its sleep."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
        sleeper = _Sleeper()
        replaced = 0
        for i, (name, m) in enumerate(self.leaves):
            recs = []
            for c in range(max((k[1] + 1 for k in self.fwd if k[0] == i), default=0)):
                out = self.outputs.get((i, c))
                if out is None:
                    break
                f = statistics.median(self.fwd[(i, c)])
                b = statistics.median(self.bwd.get((i, c), [0.0]))
                recs.append(_CallRecord(f, b, out))
                self.total_fwd_s += f
                self.total_bwd_s += b
            if not recs:
                logger.debug(f"sleep test: {name or type(m).__name__} kept (no tensor output seen)")
                continue
            m.forward = types.MethodType(_sleeping_forward(recs, sleeper), m)
            replaced += 1
        self.installed = True
        logger.info(f"sleep test: {replaced}/{len(self.leaves)} leaf modules replaced by sleeps "
                    f"(forward {self.total_fwd_s * 1e3:.2f} ms, backward {self.total_bwd_s * 1e3:.2f} ms per step)")


def _uninstall(leaves: list[tuple[str, nn.Module]]) -> None:
    for _, m in leaves:
        m.__dict__.pop("forward", None)


def _sleeping_forward(recs: list[_CallRecord], sleeper: _Sleeper) -> Any:
    state = {"n": 0}
    params = None

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        nonlocal params
        if params is None:
            params = [p for p in self.parameters(recurse=False) if p.requires_grad]
        rec = recs[state["n"] % len(recs)]
        state["n"] += 1
        tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
        return _SleepFn.apply(rec, sleeper, *tensors, *params)

    return forward


class SleepTest(Instrument):
    """The sleep test as the run drives it (``ablate.compute sleep``): the leaves timed for ``calib_steps`` steps
    (or their times loaded from ``ablate.sleep_times``), then replaced by sleeps; ``sleep_times.json`` written.

    Example::

        test = SleepTest(module, device, calib_steps=5, out_dir=Path("out"), write=True)
    """

    def __init__(self, module: nn.Module, device: torch.device, calib_steps: int, out_dir: Path, write: bool,
                 times: str = ""):
        self.sleep = SleepCompute(module, device)
        self.calib_steps, self.out_dir, self.write = calib_steps, out_dir, write
        self.fields: dict[str, Any] = {}
        if times:
            self.sleep.load(json.loads(Path(times).read_text()), device)
        else:
            self.sleep.start_calibration()

    @property
    def calibrating(self) -> bool:
        """Still timing modules (the run exchanges no gradients meanwhile)."""
        return not self.sleep.installed

    def on_backward(self, scaled_loss: torch.Tensor) -> None:
        if self.calibrating:
            self.sleep.watch(scaled_loss)

    def on_step_end(self, end: StepEnd) -> None:
        if not self.calibrating:
            return
        self.sleep.end_step()
        if end.step >= self.calib_steps:
            self.sleep.install()
            self.fields["sleep_times"] = self._write_times()

    def on_finish(self, world_size: int) -> None:
        self.sleep.uninstall()  # real modules back: evaluation uses them

    def summary(self) -> dict[str, Any]:
        return {"calibrated_compute_s": self.sleep.total_fwd_s + self.sleep.total_bwd_s, **self.fields}

    def _write_times(self) -> str:
        path = self.out_dir / "sleep_times.json"
        if self.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.sleep.export()) + "\n")
        return str(path)
