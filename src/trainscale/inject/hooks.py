"""The patches that reach an unmodified script's step, each probed first: a hook the running PyTorch (or
framework) lacks is reported as not measured, never an error in the user's job.

Every patch calls one method of the agent (``Agent.optimizer_pre``, ``optimizer_post``, ``backward``,
``next_batch``, ``ddp_created``, ``ddp_forward``) and changes nothing else: the step's math is the script's own.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .collectives import install_collectives
from .fsdp import install_fsdp
from .launchers import LIGHTNING_CONNECTORS, lightning_devices, refuse_spawn

__all__ = ["install", "after_import", "SKIP"]


def after_import(name: str, fn: Callable[[Any], None]) -> None:
    """Call ``fn(module)`` once ``name`` is imported (now, if it already is)."""
    if name in sys.modules:
        fn(sys.modules[name])
        return
    sys.meta_path.insert(0, _Watch(name, fn))


class _Watch:
    """A meta-path finder that lets ``name`` load normally, then hands the loaded module to ``fn``."""

    def __init__(self, name: str, fn: Callable[[Any], None]):
        self.name, self.fn = name, fn

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        original = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            try:
                self.fn(module)
            except Exception as e:  # a framework version we do not know: observe less, never fail its import
                sys.stderr.write(f"trainscale inject: {fullname} not patched ({type(e).__name__}: {e})\n")

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


SKIP = "TRAINSCALE_INJECT_SKIP"  # comma-separated patches to leave out (a patch that misbehaves with a framework)


def install(agent: Any) -> dict[str, str]:
    """Install every patch on the already imported torch; returns measurement -> "measured" or why not."""
    import torch

    skip = {s.strip() for s in os.environ.get(SKIP, "").split(",") if s.strip()}
    patches = {"step": _optimizer_hooks, "amp_skipped_steps": _scaler, "backward": _backward, "data_wait": _loader,
               "ddp": _ddp, "fsdp": install_fsdp, "own_processes": refuse_spawn,
               "framework_collectives": install_collectives}
    status = {name: f"not measured: left out ({SKIP})" if name in skip else patch(torch, agent)
              for name, patch in patches.items()}
    if "data_wait" not in skip:
        after_import("accelerate.data_loader", lambda m: _accelerate_loaders(m, agent))
    if "evaluation" not in skip:
        after_import("transformers.trainer", lambda m: _trainer_evaluate(m, agent))
    if "devices" not in skip:
        for module, cls in LIGHTNING_CONNECTORS:
            after_import(module, functools.partial(lightning_devices, cls_name=cls, agent=agent))
    return status


def _optimizer_hooks(torch: Any, agent: Any) -> str:
    opt = importlib.import_module("torch.optim.optimizer")
    pre = getattr(opt, "register_optimizer_step_pre_hook", None)
    post = getattr(opt, "register_optimizer_step_post_hook", None)
    if pre is None or post is None:
        return "not measured: this PyTorch has no global optimizer step hooks (torch >= 2.0 has them)"
    pre(agent.optimizer_pre)  # bound methods with the hooks' signature: one Python call each per step
    post(agent.optimizer_post)
    return "measured"


def _scaler(torch: Any, agent: Any) -> str:
    """A step the AMP scaler skips (inf/NaN gradients) fires no optimizer hook: count it as a step all the same."""
    cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if cls is None or not hasattr(cls, "step"):
        return "not measured: no torch.amp.GradScaler"
    original = cls.step

    @functools.wraps(original)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before = agent.posts
        out = original(self, optimizer, *args, **kwargs)
        if agent.posts == before:  # skipped: no post hook ran
            agent.optimizer_post(optimizer)
        return out

    cls.step = step
    return "measured"


def _backward(torch: Any, agent: Any) -> str:
    original = getattr(torch.autograd, "backward", None)
    engine = getattr(getattr(torch.autograd, "Variable", None), "_execution_engine", None)
    if original is None or not hasattr(engine, "queue_callback"):
        return "not measured: no autograd engine callback in this PyTorch"

    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        return agent.backward(original, tensors, args, kwargs)

    torch.autograd.backward = backward
    return "measured"


def _loader(torch: Any, agent: Any) -> str:
    base = getattr(importlib.import_module("torch.utils.data.dataloader"), "_BaseDataLoaderIter", None)
    if base is None or not hasattr(base, "__next__"):
        return "not measured: no DataLoader iterator in this PyTorch"
    original = base.__next__

    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        return agent.next_batch(original, self)

    base.__next__ = __next__
    return "measured"


def _ddp(torch: Any, agent: Any) -> str:
    import torch.nn.parallel as parallel

    cls = getattr(parallel, "DistributedDataParallel", None)
    if cls is None:
        return "not measured: no DistributedDataParallel"
    init, forward = cls.__init__, cls.forward

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        agent.ddp_created(self)

    @functools.wraps(forward)
    def forward_(self: Any, *args: Any, **kwargs: Any) -> Any:
        agent.ddp_forward(self)
        return forward(self, *args, **kwargs)

    cls.__init__ = __init__
    cls.forward = forward_
    post = getattr(cls, "_post_forward", None)
    if post is not None:  # where find_unused_parameters walks the autograd graph (reducer.prepare_for_backward)

        @functools.wraps(post)
        def _post_forward(self: Any, output: Any) -> Any:
            if not self.find_unused_parameters:
                return post(self, output)
            t = time.perf_counter()
            try:
                return post(self, output)
            finally:
                agent.graph_walk(time.perf_counter() - t)

        cls._post_forward = _post_forward
    return "measured" if post is not None else "measured (not find_unused_parameters' walk: no DDP._post_forward)"


def _accelerate_loaders(module: Any, agent: Any) -> None:
    """accelerate's loaders prefetch (and a dispatcher broadcasts) inside a generator: time and replay its batches
    from outside it, where the loop takes them."""
    for name in ("DataLoaderShard", "DataLoaderDispatcher"):
        cls = getattr(module, name, None)
        if cls is None or not hasattr(cls, "__iter__"):
            continue
        original = cls.__iter__

        def __iter__(self: Any, _original: Any = original, _name: str = name) -> Any:
            if _name == "DataLoaderDispatcher":
                agent.dispatched = True  # rank 0 reads every batch and sends each rank its slice
            return _Timed(_original(self), agent)

        cls.__iter__ = __iter__


def _trainer_evaluate(module: Any, agent: Any) -> None:
    """The Hugging Face Trainer evaluates between steps with its model unwrapped (no DDP forward to see): each
    ``evaluate()`` call is an evaluation pass, out of the step's time."""
    cls = getattr(module, "Trainer", None)
    original = getattr(cls, "evaluate", None)
    if original is None:
        return

    @functools.wraps(original)
    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        with agent.evaluation():
            return original(self, *args, **kwargs)

    cls.evaluate = evaluate  # type: ignore[union-attr]


class _Timed:
    """An iterator whose ``next`` goes through the agent (data wait, the no_data replay)."""

    __slots__ = ("it", "agent")

    def __init__(self, it: Any, agent: Any):
        self.it, self.agent = it, agent

    def __iter__(self) -> _Timed:
        return self

    def __next__(self) -> Any:
        return self.agent.next_batch(lambda _it: next(_it), self.it)
