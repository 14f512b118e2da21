"""The user's model as the run hands it back: a stable handle on whatever the strategy wraps it in."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ..strategies import Strategy
from .autocast_region import AutocastRegion
from .errors import RunError

__all__ = ["PreparedModel"]


class PreparedModel(nn.Module):
    """The user's model as the strategy runs it: forward goes through DDP (and autocast) while training.

    A stable handle: ``bucket_mb auto`` may re-wrap the module in a new DDP mid-run. ``state_dict``,
    ``parameters`` and attributes are the user's own module's (no ``module.`` prefix in checkpoints).
    In eval mode or under ``no_grad`` the module runs directly: no collective, so uneven eval shards cannot hang.
    Under ``strategy.amp`` the outputs come back as autocast makes them and the loss computed from them runs under
    autocast too (see ``AutocastRegion``); ``cast_outputs`` (``strategy.amp_cast_outputs``) casts them to float32
    instead, a copy of every output each step; so does a prepared model compiled after ``run.prepare`` (compile
    the model before it). FSDP's low-precision parameters without autocast are cast back so that the loss keeps
    float32.
    """

    def __init__(self, strategy: Strategy, cast_outputs: bool = False):
        super().__init__()
        object.__setattr__(self, "_strategy", strategy)  # not a submodule: the parameters are the module's
        region = AutocastRegion(strategy.autocast, scoped=cast_outputs)
        object.__setattr__(self, "_autocast_region", region)
        object.__setattr__(self, "_cast_outputs", strategy.amp and (cast_outputs or region.device is None))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        st = self._strategy
        training = self.training and torch.is_grad_enabled()
        if training and st.pipelined:
            raise RunError("a pipelined model trains through run.forward_backward(x, y, loss_fn), which runs the "
                           "schedule's micro-batches; call it instead of model(x) and run.backward")
        net = st.model if training else st.module
        region = self._autocast_region
        out = region.forward(net, *args, **kwargs)
        return _to_float(out) if self._cast_outputs or region.traced() else out

    def _end_autocast(self) -> None:
        """The run was called again: the forward's autocast region (open for the loss) ends here."""
        self._autocast_region.close()

    @property
    def module(self) -> nn.Module:
        return self._strategy.module

    def no_sync(self) -> Any:
        return self._strategy.no_sync()

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        return self._strategy.module.parameters(recurse)

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Parameter]]:
        return self._strategy.module.named_parameters(*args, **kwargs)

    def buffers(self, recurse: bool = True) -> Iterator[torch.Tensor]:
        return self._strategy.module.buffers(recurse)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._strategy.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self._strategy.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def train(self, mode: bool = True) -> PreparedModel:
        self._autocast_region.close()
        self._strategy.module.train(mode)
        return super().train(mode)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._strategy.module, name)


def _to_float(out: Any) -> Any:
    """Low-precision outputs back to float32 (a copy of each): the opt-in ``strategy.amp_cast_outputs``."""
    if torch.is_tensor(out):
        return out.float() if out.is_floating_point() and out.dtype != torch.float32 else out
    if isinstance(out, dict):
        return {k: _to_float(v) for k, v in out.items()}
    if isinstance(out, (list, tuple)) and not hasattr(out, "_fields"):
        return type(out)(_to_float(v) for v in out)
    return out
