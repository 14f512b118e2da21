"""The agent inside each rank of an unmodified script: the step boundary, data wait, backward and DDP, fed to
trainscale's own instruments; the paired experiments switched at the step boundaries; the summary at the end.

``activate`` runs once the script has imported torch (``site/sitecustomize.py``). The switches come as the run
API's do (``TRAINSCALE_ARGS``: ``--ablate.phases``, ``--job.steps``...; ``TRAINSCALE_JSON``: where the summary
goes). Every rank ends its process once ``job.steps`` steps are timed (300 unless the lab gives a number: the lab's
runs need a known length, whatever the script's own) and the summary is written; a script that ends sooner has
its summary written when it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..config import load_config, parse_override_args
from ..train.instruments import Instrument, Instruments, StepMode, start_accounting
from .collectives import CollectiveTimer
from .finish import finish_run
from .frameworks import framework_on_stack
from .graph_end import GraphEnd
from .hooks import SKIP, install
from .syncs import SyncCounter

__all__ = ["activate", "Agent", "GradMeter"]

_agent: Agent | None = None


def activate() -> None:
    """Build this rank's agent from the environment and install the hooks (once)."""
    global _agent
    if _agent is not None:
        return
    given = parse_override_args(shlex.split(os.environ.get("TRAINSCALE_ARGS", "")))
    cfg = load_config(extra=given)
    unrun = {}
    if cfg.ablate.compute == "sleep":  # needs the model's leaf modules replaced: not done from outside
        unrun["sleep"] = "the sleep test replaces the model's operators: not run on a script trainscale did not build"
        cfg.ablate.compute = "none"
    _agent = Agent(cfg, int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1")),
                   os.environ.get("TRAINSCALE_JSON", ""))
    _agent.status.update(install(_agent))
    _agent.phases_unrun.update(unrun)
    atexit.register(_agent.finish)  # the script's end; a run given job.steps ends at its last step instead


class GradMeter:
    """When this rank's backward graph was done and how long backward then waited (DDP's exchange, on CPU).

    The interface the per-rank accounting reads (``hooked``, ``last_gradient_s``, ``waits``): the arrival at the
    exchange is the end of the graph, which DDP's reducer waits on after (its callback is queued later). The end
    of the graph is the compute clock's own mark (``ComputeClock``: on CPU it adds each graph's time since its
    start to ``spent``), read around backward rather than hooked a second time: a second hook on the loss and its
    callback cost more in the step than the rest of the injection (``benchmarks/inject_overhead.py``).
    """

    __slots__ = ("hooked", "last_gradient_s", "waits", "blocked_is_exposed", "_clock")

    def __init__(self, cpu: bool, clock: Any = None):
        self.hooked, self.last_gradient_s, self.blocked_is_exposed = cpu, 0.0, False
        self.waits: list[float] = []
        self._clock = clock

    def follow(self, clock: Any) -> None:
        """Read the graph's end from ``clock`` (the run's ``ComputeClock``, built after this meter)."""
        self._clock = clock

    def backward_done(self, spent: float) -> None:
        """After backward: the graph ended at the clock's start plus what this backward added to the clock's
        ``spent`` (``spent``: its value before backward)."""
        clock = self._clock
        if not self.hooked or clock is None or clock.spent == spent:
            return  # the graph's end was not marked (no gradient flowed through the loss)
        self.last_gradient_s = clock.t0 + (clock.spent - spent)
        self.waits.append(max(0.0, time.perf_counter() - self.last_gradient_s))


class Agent:
    """One rank's view of the script's run; the hooks call its methods, which stay O(1) per call."""

    def __init__(self, cfg: Any, rank: int, world: int, json_path: str):
        self.cfg, self.rank, self.world, self.json_path = cfg, rank, world, json_path
        self.stop_at = cfg.job.steps  # the lab's run length (300 unless it gives one), or the script's end if sooner
        self.status: dict[str, str] = {}
        self.posts = self.boundaries = 0
        self.ins: Instruments | None = None
        self.meter: GradMeter | None = None
        self.graph_end: GraphEnd | None = None  # on CPU: the graph's end without a hook per step
        self.mode = StepMode()
        self.ddps: list[Any] = []
        self.fsdp_units: list[dict[str, Any]] = []  # each ``fully_shard`` call's unit (``fsdp.py``)
        self.optimizers: list[Any] = []  # the script's optimizers (their state is broadcast with the weights)
        self.fixed: Any = None  # under no_data: the training loader's batch, replayed
        self.last_it: Any = None  # the iterator of the latest batch taken
        self.train_it: Any = None  # the one whose batch the latest backward trained on (no_data replays it alone)
        self.last_wait, self.last_samples = 0.0, 0  # the latest batch's wait and samples
        self.evaluating = False  # an evaluation pass between steps: out of the step's time (``_evaluation``)
        self.eval_held = False  # the pass is a framework's evaluate() call (``evaluation``): it ends with the call
        self.eval_passes = 0
        self.trained: set[int] = set()  # the DDP models that ran a forward with gradients (a frozen teacher never)
        self.depth = 0
        self.samples: list[int] = []
        self.step_samples = self.micro = 0
        self.micro_counts: list[int] = []
        self.sync_forwards = 0  # forwards whose backward exchanges, this iteration
        self.sync_counts: list[int] = []  # the same, per iteration
        self.walk_s = 0.0  # find_unused_parameters' graph walks, summed over every iteration
        self.workers: int | None = None  # the first loader's worker processes
        self.syncs = SyncCounter()
        self.collectives = CollectiveTimer(self._pass_goes_on)  # the framework's own collectives outside DDP
        self.sync_steps: list[int] = []  # host syncs per iteration (on a GPU)
        self.dispatched = False  # accelerate's DataLoaderDispatcher: one rank reads the data for all
        self.loss_first: Any = None  # the first loss, detached: no graph of the first step is kept
        self.loss_last: Any = None
        self.clock_t0: Any = None  # the compute clock when it alone marks a forward's start (``_start``)
        self._seen: list[int] = []
        self._closing: int | None = None
        self.t_start, self.finished = time.perf_counter(), False
        self.store: Any = None
        self.out_dir = Path(".")  # the run's folder (its timeline goes there)
        self.backend = "gloo"
        self.phases_unrun: dict[str, str] = {}
        self.framework: dict[str, Any] = {}

    # ---- the step boundary (the global optimizer hooks call these two directly: no wrapper in the step)
    def optimizer_pre(self, opt: Any, args: Any = None, kwargs: Any = None) -> None:
        if self.ins is not None:
            self.ins.step_called()

    def optimizer_post(self, opt: Any, args: Any = None, kwargs: Any = None) -> None:
        """An optimizer stepped: the iteration ends when the last of the script's optimizers has (learned on the
        first repeat of one: two optimizers make one iteration; a wrapper and its inner optimizer likewise)."""
        self.posts += 1
        key = id(opt)
        if self._closing is None and key not in self._seen:
            self.optimizers.append(opt)
        if self._closing is None:
            if key not in self._seen:
                if not self._seen:
                    self.framework = framework_on_stack()
                self._seen.append(key)
                return
            self._closing = self._seen[-1]
            self.boundary()  # the first iteration, closed late: it is warm-up
        if key == self._closing:
            self.boundary()

    def boundary(self) -> None:
        """One iteration ended: time it, switch the next one's experiment, stop when the run has its steps."""
        if self.evaluating:
            self._evaluation(False)
        self.boundaries += 1
        self.collectives.step_done(self.ins, self.mode, self.boundaries - 1)
        self.micro_counts.append(self.micro)
        self.sync_counts.append(self.sync_forwards)
        self.sync_forwards = 0
        self.sync_steps.append(self.syncs.take() if self.syncs.count else 0)
        self.samples.append(self.step_samples)
        self.step_samples = self.micro = 0
        if self.ins is None:
            self._start()
            return
        done = self.boundaries - 1
        self.ins.step_done(done, self.mode)
        if self.stop_at and done >= self.stop_at:
            self.finish()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        new = self.ins.mode(done)
        if new.no_comm != self.mode.no_comm:
            self._switch(new)
        self.mode = new
        self.forward_starts()

    def forward_starts(self) -> None:
        """Mark where the next forward's compute starts: the clock's start itself where the clock alone marks it
        (one clock read; the instruments' call chain costs three calls and two reads, four times a step)."""
        if self.clock_t0 is not None:
            self.clock_t0.t0 = time.perf_counter()
        elif self.ins is not None:
            self.ins.forward_starts()

    def _start(self) -> None:
        """After the first iteration: the device, the store, the accounting and the instruments."""
        from .finish import backend_now, connect_store

        device = self._device()
        self.backend = backend_now(device)
        self.store = connect_store()
        self.meter = GradMeter(device.type == "cpu")
        # FSDP's collectives run all through forward and backward: on CPU their exposed wait is the training
        # thread's time blocked outside its data wait, as under the run API's FSDP
        self.meter.blocked_is_exposed = bool(self.fsdp_units) and device.type == "cpu"
        self.status["host_syncs"] = self.syncs.start(torch, device.type)
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        acct = None
        if self.cfg.log.accounting and self.store is not None:
            acct = start_accounting(self.rank, self.world, self.store, self.meter, device.type, attempt)
        self.out_dir = Path(self.json_path).with_suffix("") if self.json_path else Path(".")
        self.ins = Instruments(self.cfg, self.rank, self.rank == 0, device, torch.nn.Identity(), self.out_dir, acct)
        self.meter.follow(self.ins.clock)
        self.clock_t0 = _clock_alone(self.ins)
        skipped = "graph_end" in os.environ.get(SKIP, "").split(",")
        if self.ins.slow is None and self.ins.sleep is None and not skipped:  # else their loss hooks run: the clock's too
            self.graph_end = GraphEnd(self.ins.clock, self.ddps)
        self.ins.loop_starts(time.perf_counter())
        self._note_unrun(self.ins.plan.names if self.ins.plan is not None else [])
        self._switch(self.ins.mode(0))
        self.ins.forward_starts()

    def _device(self) -> torch.device:
        """Where the model trains: a DDP replica's parameters, else the optimizers' (a framework wraps nothing at
        one process: the Trainer's model on a GPU, seen on an H200, was taken for a CPU one)."""
        for ddp in self.ddps:
            for p in ddp.parameters():
                return p.device
        for opt in self.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    return p.device
        return torch.device("cpu")

    # ---- the experiments
    def _note_unrun(self, phases: list[str]) -> None:
        """The phases asked for that cannot remove what they should: they run as ``base`` and are named here."""
        reached = {k: v.startswith("measured") for k, v in self.status.items()}
        if "no_data" in phases and not reached.get("data_wait"):
            self.phases_unrun["no_data"] = f"the loader could not be reached ({self.status.get('data_wait')})"
        if "no_comm" in phases and not reached.get("ddp"):
            self.phases_unrun["no_comm"] = f"DDP could not be reached ({self.status.get('ddp')})"
        elif "no_comm" in phases and self.world > 1 and not self.ddps and self.fsdp_units:
            measured = self.meter is not None and self.meter.blocked_is_exposed
            self.phases_unrun["no_comm"] = (
                "FSDP (fully_shard) gathers the parameters in every step: its no_comm phase kept the exchange, "
                + ("whose exposed wait was measured instead" if measured else
                   "whose wait is the GPU's, not measured from the host: it is counted in compute"))
        elif "no_comm" in phases and self.world > 1 and not self.ddps:
            self.phases_unrun["no_comm"] = ("no DistributedDataParallel in this script (FullyShardedDataParallel, "
                                            "DeepSpeed or its own exchange): its no_comm phase kept the exchange")

    def _switch(self, new: StepMode) -> None:
        """Into or out of ``no_comm``: DDP's own switch, and rank 0's weights broadcast when the phase ends."""
        old, self.mode = self.mode, new
        if new.no_comm == old.no_comm:
            return
        for ddp in self.ddps:
            ddp.require_backward_grad_sync = not new.no_comm
            if old.no_comm:
                _broadcast_weights(ddp)
        if old.no_comm and self.ddps:  # momentum and moments drifted too: else the replicas part again next step
            for opt in self.optimizers:
                _broadcast_state(opt, self.ddps[0].process_group)

    def ddp_forward(self, ddp: Any) -> None:
        if not torch.is_grad_enabled():  # no exchange to switch; a model that trains, evaluated between steps
            if not self.evaluating and self.ins is not None and id(ddp) in self.trained:
                self._evaluation(True)
            return
        if self.evaluating and not self.eval_held:
            self._evaluation(False)
        self.trained.add(id(ddp))
        if self.mode.no_comm:
            ddp.require_backward_grad_sync = False  # re-asserted: a script may set it itself per micro-step
        elif ddp.require_backward_grad_sync:
            self.sync_forwards += 1
        self.forward_starts()  # compute starts with the model: a wait in the framework's collective is none

    def _evaluation(self, starts: bool) -> None:
        """An evaluation pass between steps starts or ends: its time is no step's (``Instruments.pause``).

        It starts at the first forward without gradients of a model that trains (the batch before it, another
        loader's than training's, is taken back from the step) and ends at a batch taken with gradients, a forward
        with them, a backward, the optimizer step or a framework's collective with gradients on; a framework's
        evaluate() call is one pass to its end (``evaluation``). Neither a batch taken without gradients (a training
        loop may read so) nor a frozen model's forward (a teacher's, in the step) starts one."""
        ins = self.ins
        assert ins is not None
        self.evaluating = self.collectives.paused = starts  # the pass's collectives are no step's either
        if not starts:
            ins.resume()
            self.forward_starts()
            return
        self.eval_passes += 1
        if self.last_it is not self.train_it and self.last_it is not None:
            ins.data_wait(-self.last_wait)
            self.step_samples -= self.last_samples
            self.last_it = None  # taken back once
        ins.pause()

    def _pass_goes_on(self) -> bool:
        """A framework's collective during an evaluation pass: with gradients on, outside a framework's evaluate(),
        the pass has ended (Lightning's loop runs its per-step broadcast before it takes the next batch)."""
        if self.eval_held or not torch.is_grad_enabled():
            return True
        self._evaluation(False)
        return False

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        """A framework's evaluate() call (the Hugging Face Trainer's, whose model runs unwrapped, out of DDP's
        sight): an evaluation pass for the whole call."""
        if self.ins is None:
            yield
            return
        if not self.evaluating:
            self._evaluation(True)
        self.eval_held = True
        try:
            yield
        finally:
            self.eval_held = False
            self._evaluation(False)

    def graph_walk(self, seconds: float) -> None:
        self.walk_s += seconds

    def ddp_created(self, ddp: Any) -> None:
        self.ddps.append(ddp)

    # ---- data and backward
    def next_batch(self, fetch: Any, it: Any) -> Any:
        """The loop takes a batch: its wait is data wait; under ``no_data`` the training loader's batch is replayed.

        Only the training loader's: another (an evaluation pass between steps) is read as the script reads it,
        since a loop over a replayed iterator would never end."""
        if self.depth:
            return fetch(it)
        if self.workers is None:
            self.workers = int(getattr(it, "_num_workers", 0) or 0)
        if self.evaluating and not self.eval_held and torch.is_grad_enabled():
            self._evaluation(False)
        self.last_it = it
        if self.mode.no_data and self.fixed is not None and it is self.train_it:
            batch = self.fixed
        else:
            t = time.perf_counter()
            self.depth += 1
            try:
                batch = fetch(it)
            finally:
                self.depth -= 1
            self.last_wait = time.perf_counter() - t
            if self.ins is not None and not self.evaluating:
                self.ins.data_wait(self.last_wait)
            if self.mode.no_data and it is self.train_it:
                self.fixed = batch
        first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch  # (inputs, targets): no recursion
        self.last_samples = int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() \
            else _batch_size(first)
        if not self.evaluating:
            self.step_samples += self.last_samples
        self.forward_starts()
        return batch

    def backward(self, original: Any, tensors: Any, args: tuple, kwargs: dict) -> Any:
        """``torch.autograd.backward``: the compute clock's end of graph, the exchange's wait, the loss.

        The loss is kept by reference (read once, at the end): a ``detach`` here would add a torch op to the step;
        only a graph the script keeps past backward is detached from.
        """
        loss = tensors if isinstance(tensors, torch.Tensor) and tensors.requires_grad and tensors.numel() == 1 \
            else None
        if loss is None:
            return original(tensors, *args, **kwargs)
        if self.evaluating and not self.eval_held:
            self._evaluation(False)
        self.micro += 1
        self.train_it = self.last_it
        if self.loss_first is None:
            self.loss_first = loss.detach()  # once: its value without the graph (no host sync here on a GPU)
        # By reference, read at the end: backward frees the graph's saved tensors. A graph that outlives backward
        # (``retain_graph``/``create_graph``: positional from ``Tensor.backward``) is not kept alive by us.
        kept = True in args[1:3] or bool(kwargs) and (kwargs.get("retain_graph") or kwargs.get("create_graph"))
        self.loss_last = loss.detach() if kept else loss
        ins, meter = self.ins, self.meter
        if ins is None or meter is None:
            return original(tensors, *args, **kwargs)
        spent, end = ins.clock.spent, self.graph_end
        if end is not None and end.begin():
            out = original(tensors, *args, **kwargs)
            end.done()
        else:
            ins.watch(loss)
            out = original(tensors, *args, **kwargs)
        meter.backward_done(spent)
        self.forward_starts()
        return out

    # ---- the end
    def refuse(self, why: str) -> None:
        """The script cannot be run as trainscale launches it: rank 0 leaves ``why`` for the lab, every rank ends."""
        if self.rank == 0 and self.json_path:
            Path(self.json_path + ".why").write_text(why + "\n")
        sys.stderr.write(f"trainscale: {why}\n")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the lab reads the reason left beside the summary; nothing half-run goes on

    def finish(self) -> None:
        """Every rank's figures to rank 0 through the launcher's store; rank 0 writes the summary (once)."""
        if self.finished:
            return
        self.finished = True
        if isinstance(self.loss_last, torch.Tensor):  # read as a number without the graph (no autograd warning)
            self.loss_last = self.loss_last.detach()
        finish_run(self)


def _clock_alone(ins: Instruments) -> Any:
    """The run's compute clock on CPU when no other active instrument marks a forward's start (no timeline, no
    slowed rank), else None: the agent then sets the clock's start itself (``Agent.forward_starts``)."""
    clock = ins.clock
    starts = [i for i in ins.active if type(i).on_forward_start is not Instrument.on_forward_start]
    return clock if not clock.cuda and starts == [clock] else None


def _broadcast_weights(ddp: Any) -> None:
    """Rank 0's parameters and buffers to every replica (collective over the DDP's group)."""
    import torch.distributed as dist

    with torch.no_grad():
        for t in [*ddp.module.parameters(), *ddp.module.buffers()]:
            dist.broadcast(t.data, 0, group=ddp.process_group)


def _broadcast_state(opt: Any, group: Any) -> None:
    """Rank 0's optimizer state (momentum, moments, step counts) to every replica, in parameter order."""
    import torch.distributed as dist

    with torch.no_grad():
        for pg in opt.param_groups:
            for p in pg["params"]:
                state = opt.state.get(p, {})
                for key in sorted(state):
                    if isinstance(state[key], torch.Tensor):
                        dist.broadcast(state[key], 0, group=group)


def _batch_size(batch: Any) -> int:
    """Samples in a batch: the leading size of its first tensor (a tensor, a sequence or a mapping of them)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())))
    values = getattr(batch, "values", None)  # a BatchEncoding and other mappings
    if callable(values):
        return _batch_size(list(values()))
    return 1
