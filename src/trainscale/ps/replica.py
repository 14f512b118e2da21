"""A learner's model replica whose parameters and gradients are views of one flat buffer per server shard.

A shard's slice is its tensors concatenated in model order (:class:`~.sharding.Layout`), so with the
replica's tensors laid out the same way, taking new parameters is one copy per shard and handing out
the gradient is no copy at all: backward accumulates straight into the per-shard gradient buffers (as
DDP's ``gradient_as_bucket_view`` does), and those buffers are returned as numpy arrays for Ray to
serialise. Measured against per-tensor copies, join and split in ``benchmarks/results/2026-11-23-ps-performance.md``.

Example::

    replica = Replica(model, layout, torch.device("cpu"))
    replica.load(slices)                       # parameters from the shards
    loss, grads = replica.gradient(x, y, nn.functional.cross_entropy)
    # grads[s] is shard s's flat float32 gradient slice (valid until the next call)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from .sharding import Layout

__all__ = ["Replica"]

# Arrays from Ray's object store are read-only; they are only ever copied from, never written.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class Replica:
    """``model`` on ``device`` with parameters and gradients backed by one flat buffer per shard of ``layout``."""

    def __init__(self, model: nn.Module, layout: Layout, device: torch.device):
        self.model, self.device = model.to(device), device
        params = [p for p in self.model.parameters() if p.requires_grad]
        if len(params) != len(layout.shapes):
            raise ValueError(f"the model has {len(params)} trainable tensors, the layout {len(layout.shapes)}")
        self.flat = [torch.empty(n, dtype=torch.float32, device=device) for n in layout.sizes()]
        self.grads = [torch.zeros(n, dtype=torch.float32, device=device) for n in layout.sizes()]
        for s, tensors in enumerate(layout.shards):
            offset = 0
            for t in tensors:
                n, p = math.prod(layout.shapes[t]), params[t]
                with torch.no_grad():
                    self.flat[s][offset:offset + n].copy_(p.detach().reshape(-1))
                p.data = self.flat[s][offset:offset + n].view(p.shape)
                p.grad = self.grads[s][offset:offset + n].view(p.shape)
                offset += n
        self._params = params

    def load(self, slices: Sequence[np.ndarray]) -> None:
        """Take the shards' parameter slices (one copy per shard; host to device on a GPU)."""
        with torch.no_grad():
            for buf, flat in zip(self.flat, slices):
                buf.copy_(torch.from_numpy(np.asarray(flat, dtype=np.float32)), non_blocking=True)

    def gradient(self, x: torch.Tensor, y: torch.Tensor,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[float, list[np.ndarray]]:
        """Loss and one flat gradient slice per shard on the batch (x, y); the arrays are reused by the next call."""
        for g in self.grads:
            g.zero_()
        loss = loss_fn(self.model(x.to(self.device, non_blocking=True)), y.to(self.device, non_blocking=True))
        loss.backward()
        self._check_views()
        # loss.item() is the step's one host-device sync point on a GPU; .cpu() below is then free of waits.
        value = float(loss.item())
        return value, [g.numpy() if g.device.type == "cpu" else g.cpu().numpy() for g in self.grads]

    def _check_views(self) -> None:
        # Autograd accumulates in place into a defined .grad; a model that reassigns .grad (a hook, an
        # optimizer wrapper) would silently break that, so it is checked on the first step only.
        if getattr(self, "_checked", False):
            return
        for p in self._params:
            if p.grad is not None and p.grad.untyped_storage().data_ptr() not in {
                    g.untyped_storage().data_ptr() for g in self.grads}:
                raise RuntimeError("a parameter's .grad was replaced during backward; the parameter server "
                                   "needs gradients to accumulate in place")
        self._checked = True
