"""A model as an ordered list of layers a pipeline may cut between, and each layer's measured cost.

Natural boundaries: a model's own ``pipeline_layers()`` (ResNet: stem, each block, pooled head), an
``nn.Sequential`` (nested ones flattened), or a list of submodule names the user gives. Modules without
parameters (activations, flatten) stay with the layer before them: a stage never starts with an in-place
ReLU on the activation it received.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch import nn

__all__ = ["Layer", "LayerCost", "pipeline_layers", "profile_layers"]


@dataclass
class Layer:
    """One cut-able piece of the model: its name (the parameterised module's) and its modules, run in order."""

    name: str
    module: nn.Sequential


@dataclass
class LayerCost:
    """What profiling one layer measured on this device with the real micro-batch."""

    name: str
    seconds: float  # forward + backward, median of the timed repeats
    activation_bytes: int  # the layer's output: what a stage boundary after it sends per micro-batch
    param_bytes: int


def _has_params(m: nn.Module) -> bool:
    return any(True for _ in m.parameters())


def _flatten(seq: nn.Sequential, prefix: str) -> list[tuple[str, nn.Module]]:
    out = []
    for name, child in seq.named_children():
        full = f"{prefix}{name}"
        out += _flatten(child, full + ".") if isinstance(child, nn.Sequential) else [(full, child)]
    return out


def _group(named: list[tuple[str, nn.Module]]) -> list[Layer]:
    """Attach parameterless modules to the layer before them (leading ones to the first layer)."""
    groups: list[tuple[str, list[nn.Module]]] = []
    pending: list[nn.Module] = []
    for name, m in named:
        if _has_params(m):
            groups.append((name, pending + [m]))
            pending = []
        elif groups:
            groups[-1][1].append(m)
        else:
            pending.append(m)
    if pending:  # a model without any parameters: one layer
        groups.append((named[0][0], pending))
    return [Layer(n, nn.Sequential(*ms)) for n, ms in groups]


class _Layered(Protocol):
    """A model that says where a pipeline may cut it (as ``models.resnet`` does)."""

    def pipeline_layers(self) -> list[tuple[str, nn.Module]]: ...


def pipeline_layers(model: nn.Module, names: list[str] | None = None) -> list[Layer]:
    """The model's layers in forward order; ``names``: submodules whose sequential composition is its forward."""
    if names:
        named = [(n, model.get_submodule(n)) for n in names]
    elif hasattr(model, "pipeline_layers"):
        # nn.Module types unknown attributes as Tensor | Module; this one is the model's own method.
        named = list(cast(_Layered, model).pipeline_layers())
    elif isinstance(model, nn.Sequential):
        named = _flatten(model, "")
    else:
        raise TypeError(f"{type(model).__name__} cannot be cut into pipeline stages: give an nn.Sequential, a model "
                        "with pipeline_layers(), or run.prepare(..., layers=[submodule names in forward order])")
    return _group(named)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()  # profiling only: a layer's device time needs the host to wait


def _bytes(t: Any) -> int:
    return t.numel() * t.element_size() if torch.is_tensor(t) else 0


def profile_layers(layers: list[Layer], x: torch.Tensor, repeats: int = 5, warmup: int = 2) -> list[LayerCost]:
    """Time each layer's forward + backward on ``x`` (the first layer's input) and what it sends and holds.

    Each repeat times every layer once, in turn, on the input the warm-up gave it, so a burst of load on a shared
    host lands on all layers alike instead of on the one being timed; a layer's cost is its median. The model's
    state is left as it was: buffers (BatchNorm statistics), gradients and the RNG are restored.
    """
    device = x.device
    saved = [{k: v.detach().clone() for k, v in layer.module.state_dict().items()} for layer in layers]
    inputs, outputs = [], []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        inp = x
        for layer in layers:
            inputs.append(inp)
            for _ in range(max(1, warmup)):
                out = _forward_backward(layer, inp, first=layer is layers[0])
            outputs.append(out.detach())
            inp = out.detach()
        times: list[list[float]] = [[] for _ in layers]
        for _ in range(repeats):
            for i, layer in enumerate(layers):
                _sync(device)
                t0 = time.perf_counter()
                _forward_backward(layer, inputs[i], first=i == 0)
                _sync(device)
                times[i].append(time.perf_counter() - t0)
    costs = [LayerCost(layer.name, statistics.median(t), _bytes(out),
                       sum(_bytes(p) for p in layer.module.parameters()))
             for layer, t, out in zip(layers, times, outputs)]
    for layer, state in zip(layers, saved):
        layer.module.load_state_dict(state)
        for p in layer.module.parameters():
            p.grad = None
    return costs


def _forward_backward(layer: Layer, inp: torch.Tensor, first: bool) -> Any:
    """One forward and backward of ``layer`` on a copy of ``inp``; returns its output."""
    a = inp.detach().clone()
    if a.is_floating_point() and not first:  # the model's input needs no gradient
        a.requires_grad_(True)
    out = layer.module(a)
    out.backward(torch.ones_like(out))
    return out
