"""The cost of trainscale's injection on an unmodified script's step: its hooks switched on and off in one run.

The step is the plain DDP script's (``tests/inject/scripts/ddp_train.py``: its model, loader, loss and SGD), 2
ranks on Gloo under torchrun, 1 intra-op thread each. Each rank installs the agent as an instrumented run does
(``trainscale.inject.agent.activate``: the doctor's base phase, the per-rank accounting on), then switches every
patch the agent made (the global optimizer step hooks, ``torch.autograd.backward``, the loader iterator's
``__next__``, DDP's ``forward`` and ``_post_forward``) in and out by chunks of steps, in ABBA groups (on, off,
off, on, then the mirror), so that a drift or a slow spell of a shared machine falls on both arms. A chunk's time
is its mean step, each step capped at twice the chunk's median (a pause of the machine is not the hooks'; the
accounting's block reads, tens of microseconds, count in full); its CPU time is the training thread's
(``time.thread_time``), which a wait for a core does not inflate.

``overhead_ratio``: the median over groups of (instrumented chunks' mean) / (plain chunks' mean), with its 90%
bootstrap interval over groups (``ratio_ci90``); ``cpu_ratio`` and ``cpu_ratio_ci90`` the same for CPU time.
Rank 0's figures (the ranks step together); ``load_avg``: the host's 1-minute load average at the start and the
end. Last line: one JSON object. ``--count N`` counts instead what the injection adds to the training thread's
step (Python and builtin calls, clock reads, schedstat reads, torch ops, bytes kept). ``--only GROUPS`` switches
those patch groups alone (the others out in both arms); with ``--steady GROUPS`` the latter stay in, in both arms,
so that the arms differ by ``--only``'s groups inside a fully instrumented step (one group's share of the whole).
``--floor`` replaces the agent by stubs at the same seams that only read the clock and append (``Floor``): the
least any instrumentation written in Python costs this step.

Run: python benchmarks/inject_overhead.py [--groups 120 --chunk 24 --width 512 --accounting on] [--count 200]
     [--only optimizer --steady backward,loader,ddp] [--floor]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "inject" / "scripts" / "ddp_train.py"
CLIP = 2.0


def _patch_points() -> list[tuple[Any, str]]:
    """Every (owner, attribute) the agent's hooks replace (``trainscale.inject.hooks.install``)."""
    import torch
    import torch.utils.data.dataloader as dl
    from torch.nn.parallel import DistributedDataParallel as DDP

    return [(torch.autograd, "backward"), (dl._BaseDataLoaderIter, "__next__"), (DDP, "forward"),
            (DDP, "_post_forward")]


PATCHES = {"backward": {"backward"}, "loader": {"__next__"}, "ddp": {"forward", "_post_forward"}, "optimizer": set()}


class Switch:
    """The agent's patches and global optimizer hooks, put in (``on``) or taken out (``off``) between steps.

    ``only``: the patch groups switched (``PATCHES``' names); the others stay out in both arms, so that one
    group's cost is measured alone (the agent sees less of the step then: its own figures are not read here).
    ``steady``: groups left in, in both arms (not switched): the arms then differ by ``only``'s groups within a
    fully instrumented step, so each group's share of the whole is measured.
    """

    def __init__(self, activate: Any, only: set[str] | None = None, steady: set[str] | None = None):
        import torch.optim.optimizer as opt

        self.opt = opt
        self.only = set(PATCHES) if only is None else only
        self.steady = (steady or set()) - self.only
        self.points = [(o, a) for o, a in _patch_points()
                       if any(a in PATCHES[g] for g in self.only)]
        self.plain = [getattr(o, a) for o, a in self.points]
        pre, post = dict(opt._global_optimizer_pre_hooks), dict(opt._global_optimizer_post_hooks)
        activate()
        self.patched = [getattr(o, a) for o, a in self.points]
        if self.points and all(x is y for x, y in zip(self.plain, self.patched)):
            raise RuntimeError("the agent patched nothing: is TRAINSCALE_ARGS/RANK set as an instrumented run's?")
        self.hooks = ({k: v for k, v in opt._global_optimizer_pre_hooks.items() if k not in pre},
                      {k: v for k, v in opt._global_optimizer_post_hooks.items() if k not in post})
        kept = {a for g in self.steady for a in PATCHES[g]}
        for owner, attr in _patch_points():  # the groups not measured: out in both arms, or in (``steady``)
            if (owner, attr) not in self.points and attr not in kept:
                setattr(owner, attr, getattr(owner, attr).__wrapped__)
        if "optimizer" in self.steady:
            self.hooks = ({}, {})
        elif "optimizer" not in self.only:
            self.hooks = ({}, {})
            for table in (opt._global_optimizer_pre_hooks, opt._global_optimizer_post_hooks):
                for k in [k for k in table if k not in pre and k not in post]:
                    table.pop(k)

    def set(self, on: bool) -> None:
        from trainscale.inject import agent

        end = agent._agent.graph_end if agent._agent is not None else None
        if end is not None and "backward" in self.only:  # the backward patch's persistent hook, switched with it
            end.hold(on)
        elif end is not None and "backward" not in self.steady:
            end.off()
        for (owner, attr), plain, patched in zip(self.points, self.plain, self.patched):
            setattr(owner, attr, patched if on else plain)
        for table, ours in zip((self.opt._global_optimizer_pre_hooks, self.opt._global_optimizer_post_hooks),
                               self.hooks):
            for k, v in ours.items():
                if on:
                    table[k] = v
                else:
                    table.pop(k, None)


class Floor:
    """The floor of any hook written in Python: at each of the agent's seams, a stub that reads the clock and
    appends it, then calls through (``--floor``). The agent's own patches are out in both arms.

    The same seams as the agent's: the loader iterator's ``__next__``, DDP's ``forward`` and ``_post_forward``,
    ``torch.autograd.backward``, the global optimizer pre and post hooks, and one post-accumulate-grad hook on a
    parameter (the agent's graph-end mark).
    """

    def __init__(self, model: Any):
        import torch.optim.optimizer as opt

        self.opt, self.marks = opt, []
        self.param = next(p for p in model.parameters() if p.requires_grad)
        self.points = _patch_points()
        self.plain = [getattr(o, a) for o, a in self.points]
        self.stubs = [self._stub(fn) for fn in self.plain]
        self.handles: list[Any] = []

    def _stub(self, fn: Any) -> Any:
        marks = self.marks

        def seam(*args: Any, **kwargs: Any) -> Any:
            marks.append(time.perf_counter())
            return fn(*args, **kwargs)
        return seam

    def _mark(self, *args: Any) -> None:
        self.marks.append(time.perf_counter())

    def set(self, on: bool) -> None:
        for (owner, attr), plain, stub in zip(self.points, self.plain, self.stubs):
            setattr(owner, attr, stub if on else plain)
        for h in self.handles:
            h.remove()
        self.handles = [self.opt.register_optimizer_step_pre_hook(self._mark),
                        self.opt.register_optimizer_step_post_hook(self._mark),
                        self.param.register_post_accumulate_grad_hook(self._mark)] if on else []
        del self.marks[:]


def _clipped_mean(times: list[float]) -> float:
    cap = CLIP * statistics.median(times)
    return statistics.fmean(min(t, cap) for t in times)


def _ci90(groups: list[float], reps: int = 2000, seed: int = 0) -> list[float]:
    """90% bootstrap interval of the median of per-group ratios, groups drawn with replacement."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(groups, k=len(groups))) for _ in range(reps))
    return [meds[int(0.05 * (reps - 1))], meds[int(0.95 * (reps - 1))]]


def _steps(model: Any, opt: Any, loss_fn: Any, batches: Any, n: int) -> tuple[list[float], list[float]]:
    """``n`` steps of the script's loop: per step, (wall seconds, training thread's CPU seconds)."""
    wall, cpu = [], []
    for _ in range(n):
        t, c = time.perf_counter(), time.thread_time()
        x, y = next(batches)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        wall.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
    return wall, cpu


class Tally:
    """What the training thread does in ``n`` steps: Python calls, builtin calls by name, torch ops, memory kept.

    ``sys.setprofile`` sees every Python and builtin call of this thread (clock reads and ``os.pread`` are
    builtins); a ``TorchDispatchMode`` counts the aten ops below autograd; ``tracemalloc`` the bytes still held
    after the steps (what the per-step records keep).
    """

    WATCH = ("perf_counter", "process_time", "thread_time", "pread", "register_hook", "queue_callback", "detach")

    def __init__(self) -> None:
        self.py = self.builtin = self.ops = 0
        self.named = dict.fromkeys(self.WATCH, 0)

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.py += 1
        elif event == "c_call":
            self.builtin += 1
            name = getattr(arg, "__name__", "")
            if name in self.named:
                self.named[name] += 1

    def run(self, step: Any, n: int) -> dict[str, Any]:
        """Per-step counts over ``n`` calls of ``step``."""
        import tracemalloc

        from torch.utils._python_dispatch import TorchDispatchMode

        tally = self

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                tally.ops += 1
                return func(*args, **(kwargs or {}))

        tracemalloc.start()
        held = tracemalloc.get_traced_memory()[0]
        with Ops():
            sys.setprofile(self._profile)
            try:
                step(n)
            finally:
                sys.setprofile(None)
        held = tracemalloc.get_traced_memory()[0] - held
        tracemalloc.stop()
        per = {"python_calls": self.py / n, "builtin_calls": self.builtin / n, "aten_ops": self.ops / n,
               "bytes_kept": held / n}
        return {**per, **{k: v / n for k, v in self.named.items()}}


def _endless(loader: Any, sampler: Any) -> Any:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def worker(a: argparse.Namespace) -> None:
    """One rank: the script's model and loop, the agent's hooks switched per chunk; rank 0 prints the result."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from trainscale.inject.agent import activate

    spec = importlib.util.spec_from_file_location("ddp_train", SCRIPT)
    script = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(script)  # type: ignore[union-attr]
    switch: Any = Switch(activate, set() if a.floor else set(a.only.split(",")), set(a.steady.split(",")) - {""})
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(script.ToyModel(a.width))  # created patched: the agent sees it
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    batches = _endless(DataLoader(data, batch_size=64, sampler=sampler), sampler)
    loss_fn = torch.nn.CrossEntropyLoss()
    if a.floor:
        switch = Floor(model)
    for on in (True, False):  # warm both arms; the agent starts its instruments at its first boundary
        switch.set(on)
        _steps(model, opt, loss_fn, batches, 3 * a.chunk)
    if a.count:
        _count(a, switch, lambda n: _steps(model, opt, loss_fn, batches, n))
        return
    arms: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    ratios, cpu_ratios = [], []
    for grp in range(a.groups):
        got: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for on in ((True, False, False, True) if grp % 2 else (False, True, True, False)):
            switch.set(on)
            wall, cpu = _steps(model, opt, loss_fn, batches, a.chunk)
            got[on].append((_clipped_mean(wall[1:]), _clipped_mean(cpu[1:])))  # the step after a switch left out
        for on in (True, False):
            arms[on] += got[on]
        mean = {on: [statistics.fmean(x[i] for x in got[on]) for i in (0, 1)] for on in (True, False)}
        ratios.append(mean[True][0] / mean[False][0])
        cpu_ratios.append(mean[True][1] / mean[False][1])
    switch.set(False)
    if dist.get_rank() == 0:
        print(json.dumps({
            "benchmark": "inject_overhead", "width": a.width, "groups": a.groups, "chunk_steps": a.chunk,
            "plain_ms": round(statistics.median(w for w, _ in arms[False]) * 1e3, 4),
            "instrumented_ms": round(statistics.median(w for w, _ in arms[True]) * 1e3, 4),
            "overhead_ratio": round(statistics.median(ratios), 5), "ratio_ci90": [round(x, 5) for x in _ci90(ratios)],
            "plain_cpu_ms": round(statistics.median(c for _, c in arms[False]) * 1e3, 4),
            "instrumented_cpu_ms": round(statistics.median(c for _, c in arms[True]) * 1e3, 4),
            "cpu_ratio": round(statistics.median(cpu_ratios), 5), "accounting": a.accounting, "patches": "floor" if a.floor else a.only,
            **({"steady": a.steady} if a.steady else {}),
            "cpu_ratio_ci90": [round(x, 5) for x in _ci90(cpu_ratios)]}), flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # the agent's end-of-run summary is not this benchmark's


def _count(a: argparse.Namespace, switch: Switch, steps: Any) -> None:
    """Per-step counts of the training thread's work, plain and instrumented (rank 0 prints them)."""
    import torch.distributed as dist

    arms = {"on": True, "off": False} if a.arm == "both" else {a.arm: a.arm == "on"}
    got = {}
    for name, on in arms.items():
        switch.set(on)
        steps(a.chunk)  # the step after a switch is not counted
        got[name] = Tally().run(steps, a.count)
    if dist.get_rank() == 0:
        extra = {k: round(got["on"][k] - got["off"][k], 2) for k in got["on"]} if len(got) == 2 else {}
        print(json.dumps({"benchmark": "inject_overhead_count", "steps": a.count, "per_step": got,
                          "added_per_step": extra}), flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=120)
    p.add_argument("--chunk", type=int, default=24, help="steps per on or off chunk")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--accounting", choices=("on", "off"), default="on",
                   help="the per-rank accounting (schedstat reads) in the instrumented arm, as the doctor runs it: on")
    p.add_argument("--only", default=",".join(PATCHES),
                   help=f"patch groups switched, comma-separated (default all: {','.join(PATCHES)})")
    p.add_argument("--steady", default="",
                   help="patch groups left in, in both arms (not switched): the share of --only's groups in the "
                        "whole injection")
    p.add_argument("--floor", action="store_true",
                   help="instead of the agent: at each of its seams a stub that reads the clock and appends it (the "
                        "least any hook written in Python costs this step)")
    p.add_argument("--count", type=int, default=0,
                   help="instead of timing: count the training thread's work per step over this many steps")
    p.add_argument("--arm", choices=("on", "off", "both"), default="both",
                   help="with --count: the arms counted (one arm alone: for strace -c -f of the run)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a)
        return
    folder = tempfile.mkdtemp(prefix="inject_overhead_")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSCALE_")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]),
                "TRAINSCALE_JSON": str(Path(folder) / "summary.json"),
                "TRAINSCALE_ARGS": "--log.progress none --job.threads 1 --job.steps 100000000 --log.accounting "
                                   + ("true" if a.accounting == "on" else "false")})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
           "--worker", "--groups", str(a.groups), "--chunk", str(a.chunk), "--width", str(a.width),
           "--accounting", a.accounting, "--only", a.only, "--steady", a.steady, *(["--floor"] if a.floor else []), "--count", str(a.count),
           "--arm", a.arm]
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        sys.exit(f"inject_overhead: the run failed (exit {out.returncode}): {out.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if not a.count:  # the machine's 1-minute load average at the start and the end (a shared host's noise)
        result["load_avg"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
