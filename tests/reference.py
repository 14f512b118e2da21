"""The one-process reference that parity tests compare a launched run with: plain PyTorch SGD on digits."""

from __future__ import annotations

import torch

from trainscale.config import DataConfig
from trainscale.data import DeviceNormalize, ShardedSampler, build_datasets
from trainscale.models import build_model


def one_process_sgd(steps: int, global_batch: int, lr: float, width: int, clip: float = 0.0, **model_kw: int
                    ) -> tuple[dict[str, torch.Tensor], list[float]]:
    """An mlp trained in one process on the whole global batch, in the sampler's order: (final weights, losses).

    ``clip``: ``torch.nn.utils.clip_grad_norm_`` to this norm before each step (0: none).
    """
    torch.manual_seed(0)
    train, _, info = build_datasets(DataConfig(name="digits"))
    model = build_model("mlp", info.in_shape, info.num_classes, width=width, **model_kw)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    order = list(ShardedSampler(len(train), 0, 1, shuffle=True, seed=0))
    norm = DeviceNormalize(info, torch.device("cpu"))
    losses = []
    for step in range(steps):
        x, y = norm(train.__getitems__(order[step * global_batch:(step + 1) * global_batch]))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return model.state_dict(), losses
