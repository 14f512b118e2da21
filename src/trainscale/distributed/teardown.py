"""Ending the process groups so that a finished process exits with its own status, never an abort.

Why the order matters (measured in benchmarks/results/2026-11-25-exit-stress.md; a rank's core dump showed it):
a Gloo process group runs its collectives on worker threads (``pt_gloo_runloop``). A worker drops its
reference to a finished collective *after* waking the caller, and when the collective's tensors were made in
Python, that last drop takes the GIL to release their Python objects. If the main thread reaches interpreter
finalization first (a loaded host deschedules the worker for a moment), the worker's GIL request ends the
thread with ``pthread_exit``, whose unwinding through the worker's ``noexcept`` loop calls ``std::terminate``:
"terminate called without an active exception", SIGABRT, a finished job reported as killed.

Only destroying the group ends that race: its destructor joins the workers, and it releases the GIL while it
does (pybind's holder for ``ProcessGroup``), so a worker can finish its release. ``destroy_process_group()``
destroys a group only when nothing else holds it, and much does: a DDP reducer, a pipeline's stages and
schedule, a comm hook's state, local SGD's averager, ZeRO, the checkpoints' own group, and torch itself
(``torch.distributed.nn.functional`` and ZeRO take ``group=group.WORLD`` as a default argument, bound to the
live group object when they are imported after ``init_process_group``: DDP imports them). So: stop the
threads that call into c10d, release every holder while the group is still registered (a holder freed after
it would run the group's destructor under the GIL, which a waiting worker may need), collect the cycles DDP
sits in, and destroy the groups last. ``install_exit_guard`` does the same at interpreter exit for what was
not ended (a run without ``finish()``, a user's ``destroy_process_group()`` while a DDP model lives).
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import time
import types
from collections.abc import Callable, Iterable
from typing import Any

from ..log import logger

__all__ = ["end_process_group", "release", "gloo_threads", "install_exit_guard", "on_exit"]

_GLOO_WORKER = "pt_gloo_runloop"  # the thread name ProcessGroupGloo gives its workers
_exit_callbacks: list[Callable[[], None]] = []
_guard_installed = False


def gloo_threads() -> int:
    """Gloo worker threads alive in this process (0 once every Gloo group is destroyed; -1: cannot tell)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return -1
    n = 0
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += f.read().strip() == _GLOO_WORKER
        except OSError:  # the thread ended while we looked
            continue
    return n


def release(obj: Any) -> None:
    """Drop what ``obj`` holds of a process group: its own ``release()``, a DDP's reducer, ZeRO's group."""
    if obj is None:
        return
    if callable(getattr(obj, "release", None)):
        obj.release()
        return
    from torch.nn.parallel import DistributedDataParallel as DDP
    if isinstance(obj, DDP):
        for name in ("reducer", "logger", "process_group"):  # the model stays usable on its module's weights
            obj.__dict__.pop(name, None)
    elif hasattr(obj, "process_group") and type(obj).__name__ == "ZeroRedundancyOptimizer":
        obj.process_group = None


def end_process_group(owned: bool = True, barrier: bool = False, threads: Iterable[Callable[[], None]] = (),
                      holders: Iterable[Any] = ()) -> None:
    """End this process's part of the job in the one safe order: threads, holders, cycles, then the groups.

    ``threads``: callables that stop and join threads calling into c10d (the watchdog's heartbeat, an
    asynchronous checkpoint's writer, a loader's prefetch thread). ``holders``: objects holding a group
    (a strategy, a DDP model, a ZeRO optimizer), released by :func:`release`. ``barrier``: wait for every
    rank first (never at interpreter exit: another rank may be gone). ``owned``: destroy the groups (a group
    the caller made is the caller's to end). See the module docstring for why this order.

    Example::

        model = DistributedDataParallel(net)
        ...  # train
        end_process_group(owned=True, barrier=True, holders=[model])
    """
    import torch.distributed as dist

    for stop in threads:
        stop()
    for h in holders:
        release(h)
    if not (dist.is_available() and dist.is_initialized()):
        if not _all_ended():  # a group ended elsewhere whose workers live on: free what still holds it
            gc.collect()
            _drop_dead_groups()
        return  # else no group was made, or all are ended: nothing can race the interpreter's end
    gc.collect()  # DDP's reducer sits in reference cycles: freed while its group is still registered
    if barrier:
        dist.barrier()
    if owned:
        dist.destroy_process_group()
        if not _all_ended():
            _drop_dead_groups()


def _all_ended() -> bool:
    """Whether no group is left whose threads could race finalization: no Gloo worker alive, CUDA never used.

    Then the collections that free forgotten groups (0.15-0.3 s each beside torch's heap, more once
    ``torch._dynamo`` is imported, as an optimizer does) have nothing to do.
    """
    import torch

    return gloo_threads() == 0 and not torch.cuda.is_initialized()


def _drop_dead_groups() -> None:
    """Free groups no longer registered: torch's default arguments that still hold them, then a collection."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    live = set(c10d._world.pg_map) if dist.is_initialized() else set()
    dead: list[Any] = []  # held here so the last reference drops below, on pybind's GIL-free path
    for name, mod in list(sys.modules.items()):
        if not name.startswith("torch.distributed") or mod is None:
            continue
        for obj in list(vars(mod).values()):
            # By type, not isinstance: that would touch torch's deprecated stand-ins (reduce_op), which warn.
            for fn in list(vars(obj).values()) if issubclass(type(obj), type) else [obj]:  # methods: FSDP's scaler
                if type(fn) is types.FunctionType:
                    _drop_defaults(fn, live, dead)
    if dead and _held_only_by(dead):
        dead.clear()  # the last references: each group is destroyed here, its workers joined
        if gloo_threads() == 0:
            return  # nothing else held a group: no collection needed (0.2-0.3 s each beside torch's heap)
    gc.collect()  # cycles that hold a group (a DDP reducer) go first, while ``dead`` keeps the group alive
    dead.clear()
    gc.collect()
    left = gloo_threads()
    if left > 0 and not dist.is_initialized():
        logger.debug(f"{left} Gloo worker threads still alive after the groups were destroyed: something holds a group")


def _held_only_by(dead: list[Any]) -> bool:
    """Whether every group in ``dead`` is referenced from ``dead`` alone (no cycle or other object holds it)."""
    groups = {id(g): g for g in dead}
    for g in groups.values():
        # getrefcount's own argument, the loop's name and the dict's value: 3 beyond the list's references
        if sys.getrefcount(g) - 3 > sum(x is g for x in dead):
            return False
    return True


def _drop_defaults(fn: types.FunctionType, live: set, dead: list[Any]) -> None:
    """Replace default arguments of ``fn`` bound to a destroyed group with None (the default group when called)."""
    from torch.distributed import ProcessGroup

    code_defaults = fn.__defaults__
    if code_defaults and any(isinstance(d, ProcessGroup) and d not in live for d in code_defaults):
        dead.extend(d for d in code_defaults if isinstance(d, ProcessGroup))
        fn.__defaults__ = tuple(None if isinstance(d, ProcessGroup) and d not in live else d for d in code_defaults)
    kw = fn.__kwdefaults__
    if kw and any(isinstance(d, ProcessGroup) and d not in live for d in kw.values()):
        dead.extend(d for d in kw.values() if isinstance(d, ProcessGroup))
        fn.__kwdefaults__ = {k: None if isinstance(d, ProcessGroup) and d not in live else d for k, d in kw.items()}


def on_exit(callback: Callable[[], None]) -> None:
    """Run ``callback`` in the exit guard, before the groups are ended (a run that never called ``finish()``)."""
    install_exit_guard()
    _exit_callbacks.append(callback)


def install_exit_guard() -> None:
    """Once per process: at interpreter exit, end what is still open, in the safe order, before finalization.

    ``atexit`` runs while the interpreter is intact (the Gloo workers can still take the GIL); after it,
    finalization begins and a worker that needs the GIL aborts the process.
    """
    global _guard_installed
    if not _guard_installed:
        _guard_installed = True
        atexit.register(_at_interpreter_exit)


def _at_interpreter_exit() -> None:
    import torch.distributed as dist

    while _exit_callbacks:
        try:
            _exit_callbacks.pop()()
        except Exception as e:  # the process is ending: say so, and end the groups anyway
            logger.warning(f"at exit: {type(e).__name__}: {e}")
    if not (dist.is_available() and dist.is_initialized()) and _all_ended():
        return  # every group was ended in order (finish()): nothing left to race the interpreter's end
    gc.collect()
    groups = _release_lingering_holders()  # while their groups are registered, as end_process_group does
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # left open at exit: nothing can use it any more, and ended here it is safe
    _drop_dead_groups()
    groups.clear()  # the last references, on pybind's GIL-free path
    gc.collect()
    if gloo_threads() > 0:
        time.sleep(0.05)  # a group something unknown still holds: let its workers finish a release with the GIL free


def _subclasses(cls: type) -> set[type]:
    out: set[type] = {cls}
    todo: list[type] = [cls]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        for sub in subs:
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def _release_lingering_holders() -> list[Any]:
    """DDP models and ZeRO optimizers alive at exit: released (their groups returned, to be freed last).

    One line says what to do when a DDP model outlived its group (``destroy_process_group()`` called while it lived).
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel as DDP

    live = set(c10d._world.pg_map) if dist.is_available() and dist.is_initialized() else set()
    kinds = _subclasses(DDP)  # by type: isinstance on every object would touch torch's deprecated stand-ins
    ddps = [o for o in gc.get_objects() if type(o) in kinds and "reducer" in o.__dict__]
    zeros = [o for o in gc.get_objects() if type(o).__name__ == "ZeroRedundancyOptimizer"
             and getattr(o, "process_group", None) is not None]
    groups = [o.__dict__.get("process_group") for o in ddps] + [o.process_group for o in zeros]
    if any(o.__dict__.get("process_group") not in live for o in ddps):
        print("trainscale: destroy_process_group() was called while a DistributedDataParallel model was alive, "
              "which keeps the group's threads running until exit, where they can abort the process; delete the "
              "model (del model; gc.collect()) before destroying the group, or end both with "
              "trainscale.distributed.teardown.end_process_group(holders=[model])", file=sys.stderr, flush=True)
    for o in [*ddps, *zeros]:
        release(o)
    gc.collect()
    return groups
