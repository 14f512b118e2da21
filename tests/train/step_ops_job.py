"""One steady-state step recorded op by op: a plain PyTorch loop and the run API on the same model, seed and batch.

    trainscale launch --nproc-per-node 2 tests/train/step_ops_job.py OUT.json

Each rank trains ``examples/gpt.py``'s model (nanoGPT's shape, a vocabulary large enough that a cast of its
logits writes megabytes) under bf16 autocast, twice per loop form: the plain loop (no wrapper at world size 1,
a hand-written DDP loop above) and the run API (``--strategy.amp bf16``). The fourth of five optimizer steps (the
run's first timed step, after the third that its FLOP meter counts; a log point, as the second was), from the end of the third to
the end of the fourth (the next batch included), is recorded by a ``TorchDispatchMode``
(every aten op with its output shapes, dtypes and the bytes it writes) and a ``FlopCounterMode``. A compiled pass
(``torch.compile`` with a backend that only counts graphs) gives the graphs each loop compiles. Rank 0 writes
the records as one JSON object; ``test_step_ops.py`` compares them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

import trainscale


def _load_example(name: str) -> ModuleType:
    """``examples/NAME.py`` as an imported module (dynamo reads a traced function's module from sys.modules)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", Path(__file__).parents[2] / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpt = _load_example("gpt")

VOCAB, BLOCK, BATCH, STEPS, RECORDED = 4096, 32, 8, 5, 3  # logits: 8 x 32 x 4096 (2 MB in bf16)
CLIP = 1.0



class NanoGPT(nn.Module):
    """nanoGPT's interface: ``forward(ids, targets)`` returns the logits and the loss computed inside."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = gpt.GPT(VOCAB, BLOCK, layers=2, heads=2, d=32)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.gpt(ids)
        return logits, gpt.next_token_loss(logits, targets)


class OpRecorder(TorchDispatchMode):
    """Every aten op dispatched while active: [name, output shapes, output dtypes, bytes written]."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[list[Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        view = getattr(func, "is_view", False)  # a view writes nothing; an in-place op writes its output
        written = 0 if view else sum(t.numel() * t.element_size() for t in tensors)
        self.ops.append([f"{func.namespace}.{func._opname}", [list(t.shape) for t in tensors],
                         [str(t.dtype).removeprefix("torch.") for t in tensors], written])
        return out


class Window:
    """Records optimizer step ``RECORDED`` (0-based): enter after step RECORDED-1 ends, leave when RECORDED ends."""

    def __init__(self, flops: bool = True) -> None:
        self.ops = OpRecorder()
        self.flops = FlopCounterMode(display=False) if flops else None  # its module hooks: not with torch.compile
        self._stack = contextlib.ExitStack()

    def step_ended(self, i: int) -> None:
        if i == RECORDED - 1:
            self._stack.enter_context(self.ops)
            if self.flops is not None:
                self._stack.enter_context(self.flops)
        elif i == RECORDED:
            self._stack.close()

    def record(self, losses: list[torch.Tensor], graphs: int | None = None) -> dict[str, Any]:
        flops = self.flops.get_total_flops() if self.flops is not None else None
        return {"ops": self.ops.ops, "flops": flops, "graphs": graphs,
                "loss_dtype": str(losses[0].dtype).removeprefix("torch."), "losses": [float(v) for v in losses]}


def batches() -> tuple[torch.Tensor, torch.Tensor]:
    """The same batch for both loops and every step: ``BATCH`` windows of random tokens, per rank."""
    g = torch.Generator().manual_seed(100 + int(os.environ.get("RANK", 0)))
    ids = torch.randint(VOCAB, (BATCH, BLOCK + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def build(form: str, backend: Callable | None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The form's model (seeded: the same weights in both loops), compiled when ``backend`` is given, and AdamW."""
    torch.manual_seed(0)
    model: nn.Module = NanoGPT() if form == "nanogpt" else gpt.GPT(VOCAB, BLOCK, layers=2, heads=2, d=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # nanoGPT's choice: no per-parameter .item()
    if backend is not None:
        model = torch.compile(model, backend=backend)  # type: ignore[assignment]
    return model, opt


def step_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, form: str) -> torch.Tensor:
    """nanoGPT's ``logits, loss = model(x, y)``, or the README's ``loss = loss_fn(model(x), y)``."""
    if form == "nanogpt":
        return model(x, y)[1]
    return gpt.next_token_loss(model(x), y)


def plain_loop(form: str, window: Window, backend: Callable | None) -> list[torch.Tensor]:
    """What a user writes: autocast around the forward and the loss, clipping, AdamW; DDP only above 1 process."""
    model, opt = build(form, backend)
    if dist.is_initialized() and dist.get_world_size() > 1:
        model = DDP(model)
    losses = []
    for i in range(STEPS):
        x, y = batches()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = step_loss(model, x, y, form)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        window.step_ended(i)
    return losses


def run_api_loop(form: str, window: Window, backend: Callable | None) -> list[torch.Tensor]:
    """The same loop on the run API, as the README writes it; a log point every 2 steps (the recorded one is)."""
    run = trainscale.init(args=["--strategy.amp", "bf16", "--log.every", "2", "--log.progress", "none",
                                "--log.metrics", "false"])
    model, opt = build(form, backend)
    model, opt, _ = run.prepare(model, opt)
    losses = []
    for i, (x, y) in enumerate(run.batches(batches, steps=STEPS)):
        loss = step_loss(model, x, y, form)
        run.backward(loss)
        run.clip_gradients(CLIP)
        run.step()
        losses.append(loss.detach())
        window.step_ended(i)
    run.finish()
    return losses


def counting_backend() -> tuple[list[int], Callable]:
    """A ``torch.compile`` backend that runs each graph as traced and counts them."""
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable:
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    return graphs, backend


def main() -> None:
    out = Path(sys.argv[1])
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("gloo")  # the plain loop's own group; the run API joins it
    torch.set_num_threads(1)
    records: dict[str, Any] = {"world": world}
    for form in ("nanogpt", "readme"):
        for name, loop in (("plain", plain_loop), ("run", run_api_loop)):
            window = Window()
            records[f"{name}/{form}"] = window.record(loop(form, window, None))
    for name, loop in (("plain", plain_loop), ("run", run_api_loop)):
        torch._dynamo.reset()
        graphs, backend = counting_backend()
        window = Window(flops=False)
        records[f"{name}/compiled"] = window.record(loop("nanogpt", window, backend), graphs=len(graphs))
    if int(os.environ.get("RANK", 0)) == 0:
        out.write_text(json.dumps(records))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
