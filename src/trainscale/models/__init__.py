"""Model registry: name → builder(in_shape, num_classes, width, depth) → nn.Module.

Example::

    model = build_model("resnet18", in_shape=(3, 32, 32), num_classes=10, width=16)
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from ..config import ConfigError

__all__ = ["register", "build_model", "available", "check_name", "count_tensors", "import_callable"]

Builder = Callable[..., nn.Module]
_REGISTRY: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator adding a builder under ``name``."""

    def deco(fn: Builder) -> Builder:
        _REGISTRY[name] = fn
        return fn

    return deco


def available() -> list[str]:
    """Registered model names (plus torchvision:/timm: prefixes when those packages are installed)."""
    names = sorted(_REGISTRY)
    names += [f"{pkg}:NAME" for pkg in ("torchvision", "timm") if importlib.util.find_spec(pkg)]
    return names


def import_callable(name: str, key: str) -> Callable[..., Any]:
    """``package.module:function`` -> the function (a user's own code, found on ``PYTHONPATH``).

    ``key`` is the configuration field that named it, for the error line.
    """
    mod_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(key, name, f"cannot import {mod_name} ({e}); is it on PYTHONPATH?") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(key, name, f"{mod_name} has no callable {attr!r}")
    return fn


def _import_builder(name: str) -> Builder:
    return import_callable(name, "model.name")


def _call_builder(fn: Builder, **kw: object) -> nn.Module:
    """Call a user's builder with the keyword arguments it declares (in_shape, num_classes, width, depth)."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kw = {k: v for k, v in kw.items() if k in params}
    model = fn(**kw)
    if not isinstance(model, nn.Module):
        raise ConfigError("model.name", getattr(fn, "__name__", fn), f"returned {type(model).__name__}, not an nn.Module")
    return model


def check_name(name: str) -> None:
    """Raise ConfigError unless ``name`` can be built here."""
    if ":" in name:
        pkg = name.partition(":")[0]
        if pkg not in ("torchvision", "timm"):
            _import_builder(name)  # a user's module.path:function
            return
        if importlib.util.find_spec(pkg) is None:
            raise ConfigError("model.name", name, f"{pkg} is not installed (pip install {pkg})")
    elif name not in _REGISTRY:
        raise ConfigError("model.name", name, "one of " + ", ".join(available()))


def build_model(name: str, in_shape: tuple[int, ...], num_classes: int, width: int = 0, depth: int = 2) -> nn.Module:
    """Build a registered model, ``torchvision:NAME`` / ``timm:NAME``, or a user's ``module.path:function``.

    A user's builder receives those of ``in_shape, num_classes, width, depth`` it declares.
    """
    check_name(name)
    if ":" in name:
        pkg, _, sub = name.partition(":")
        if pkg not in ("torchvision", "timm"):
            return _call_builder(_import_builder(name), in_shape=tuple(in_shape), num_classes=num_classes,
                                 width=width, depth=depth)
        if pkg == "timm":
            import timm
            return timm.create_model(sub, pretrained=False, num_classes=num_classes, in_chans=in_shape[0])
        import torchvision.models as tvm
        return tvm.get_model(sub, weights=None, num_classes=num_classes)
    return _REGISTRY[name](in_shape=tuple(in_shape), num_classes=num_classes, width=width, depth=depth)


def count_tensors(model: nn.Module) -> int:
    """Trainable parameter tensors (each is one all-reduce without fusion)."""
    return sum(1 for p in model.parameters() if p.requires_grad)


from . import mlp, resnet  # noqa: E402,F401  (register the built-in models)
