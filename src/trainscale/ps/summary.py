"""The ``--json`` summary of a parameter-server run, and evaluation of its parameters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..config import PsConfig
from .data import TrainArrays, channel_stats, normalise, resolve_loss, targets
from .record import RunRecord
from .sharding import Layout

__all__ = ["evaluate", "summarize"]


@torch.no_grad()
def evaluate(model: nn.Module, layout: Layout, slices: Sequence[np.ndarray], data: TrainArrays, info: Any,
             loss: str) -> tuple[float | None, float | None]:
    """(mean loss, accuracy) of ``model`` carrying the parameters ``slices`` on ``data``.

    Accuracy needs integer targets and class scores (N, classes); otherwise it is None. Both are None
    for an empty evaluation set.
    """
    if len(data.y) == 0:
        return None, None
    params = [p for p in model.parameters() if p.requires_grad]
    for p, w in zip(params, layout.join(slices)):
        p.data = torch.from_numpy(np.array(w, dtype=np.float32))
    model.eval()
    x_all, y_all = torch.from_numpy(data.x), targets(torch.from_numpy(data.y))
    mean, std = channel_stats(info.mean, info.std, x_all.dim())
    loss_fn = resolve_loss(loss)
    total, correct, n, classify = 0.0, 0, 0, not y_all.is_floating_point()
    for i in range(0, len(y_all), 512):
        out, y = model(normalise(x_all[i:i + 512], mean, std)), y_all[i:i + 512]
        total += float(loss_fn(out, y)) * len(y)
        n += len(y)
        classify = classify and out.dim() == 2 and y.dim() == 1
        if classify:
            correct += int((out.argmax(1) == y).sum())
    return total / n, (correct / n if classify else None)


def summarize(cfg: PsConfig, k: int, rec: RunRecord, eval_accuracy: float | None,
              eval_curve: list[dict[str, Any]], eval_loss: float | None = None, parameters: int = 0) -> dict[str, Any]:
    """One JSON-ready object with the fields of issue 6 (plus counters and the timeline).

    ``mean_update_interval_s`` is measured from the first update to the last, so the start-up of the
    learners is not in it; ``loss_last`` averages the last tenth of the updates.
    """
    times = rec.update_times
    interval = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else (times[0] if times else 0.0)
    if rec.stale_stats is not None:
        s_sum, s_count, s_max = rec.stale_stats
        stale_mean, stale_max = (s_sum / s_count if s_count else 0.0), s_max
    else:
        stale_mean = float(np.mean(rec.staleness)) if rec.staleness else 0.0
        stale_max = int(max(rec.staleness)) if rec.staleness else 0
    tail = rec.losses[-max(1, len(rec.losses) // 10):]
    loss_first = rec.loss_first if rec.loss_first is not None else (rec.losses[0] if rec.losses else None)
    loss_last = rec.loss_last if rec.loss_last is not None else (float(np.mean(tail)) if tail else None)
    return {
        "mode": cfg.mode, "learners": cfg.learners, "k": k, "shards": cfg.shards, "lr_rule": cfg.lr_rule,
        "delay": cfg.delay, "parameters": parameters, "updates": rec.updates,
        "updates_per_s": rec.updates / rec.wall_s if rec.wall_s > 0 else 0.0,
        "mean_update_interval_s": interval,
        "staleness_mean": stale_mean, "staleness_max": stale_max,
        "loss_first": loss_first, "loss_last": loss_last, "eval_accuracy": eval_accuracy, "eval_loss": eval_loss,
        "bytes_pushed": rec.bytes_pushed, "bytes_pulled": rec.bytes_pulled, "wall_s": rec.wall_s,
        "minibatch_overhead_s": float(np.mean(rec.overheads)) if rec.overheads else None,
        "phases_ms": rec.phase_means_ms(),
        "restarts": rec.restarts, "learner_restarts": rec.learner_restarts, "shard_restarts": rec.shard_restarts,
        "updates_lost": rec.updates_lost, "cancelled": rec.cancelled, "errors": rec.errors,
        "eval_curve": eval_curve, "timeline": rec.timeline,
    }
