"""``trainscale train``'s job on the run API: a model and data set from the configuration, exact evaluation.

Usable from plain Python (``Trainer(cfg, model=my_module).fit()``) and what ``trainscale train`` runs.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import Dataset

from ..config import Config, ConfigError
from ..data import DataInfo, build_datasets, eval_batches, infer_info
from ..distributed import DistEnv
from ..log import logger
from ..models import build_model
from ..models.losses import resolve_loss
from .run import init
from .schedule import lr_at

__all__ = ["Trainer", "prepare", "build_optimizer", "resolve_loss"]

def build_optimizer(params: Any, cfg: Config) -> torch.optim.Optimizer:
    """The optimizer named by ``optim.name`` (its rate is set every step by the schedule).

    On CUDA it is PyTorch's fused implementation: one kernel per step, and with fp16 the loss scaler
    hands it the overflow flag on the device instead of reading it on the host every step.
    """
    o = cfg.optim
    params = list(params)
    fused = bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)
    kw: dict[str, Any] = {"fused": True} if fused else {}
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, **kw)
    return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, **kw)


def prepare(model: nn.Module, cfg: Config | None = None) -> tuple[nn.Module, DistEnv]:
    """Join the process group and wrap a user's model with the configured strategy (the older, model-only API).

    ``trainscale.init()`` and its run's ``prepare`` carry every strategy and measurement; this keeps scripts
    written against the first API working::

        model, env = trainscale.prepare(MyNet())
    """
    run = init(cfg)
    for key in ("local_sgd_period", "shard_optimizer"):  # they act in the run's step, not in the model
        if getattr(run.cfg.strategy, key):
            raise ConfigError(f"strategy.{key}", getattr(run.cfg.strategy, key), "needs trainscale.init(); "
                              "not in prepare()")
    if run.cfg.strategy.pipeline_stages > 1:
        raise ConfigError("strategy.pipeline_stages", run.cfg.strategy.pipeline_stages, "needs trainscale.init() "
                          "and run.forward_backward(); not in prepare()")
    model, _, _ = run.prepare(model)
    return model, run.env


def _infer_info(ds: Dataset) -> DataInfo:
    x, y = ds[0][0], ds[0][1]
    if torch.is_tensor(y) and y.is_floating_point():  # regression: the model predicts y's shape
        return infer_info(tuple(x.shape), y.unsqueeze(0))
    labels = getattr(ds, "labels", None)
    return infer_info(tuple(x.shape), labels if torch.is_tensor(labels) else None)


class Trainer:
    """Train ``cfg.model`` (or ``model``) on ``cfg.data`` (or ``train_data``) with the configured strategy."""

    def __init__(self, cfg: Config | None = None, model: nn.Module | None = None,
                 train_data: Dataset | None = None, eval_data: Dataset | None = None,
                 data_info: DataInfo | None = None, resume: str | None = None, json_path: str | None = None):
        self.cfg = cfg or Config()
        self.user_model, self.train_data, self.eval_data, self.info = model, train_data, eval_data, data_info
        self.resume, self.json_path = resume, json_path

    def fit(self) -> dict[str, Any]:
        """Run to ``job.steps``, evaluate, checkpoint, and return (and write) the run summary."""
        cfg = self.cfg
        run = init(cfg, json_path=self.json_path)
        self.cfg = cfg = run.cfg
        data_name = cfg.data.name if self.train_data is None else "user"
        if self.train_data is None:
            self.train_data, self.eval_data, self.info = build_datasets(cfg.data)
        self.info = self.info or _infer_info(self.train_data)
        model = self.user_model or build_model(cfg.model.name, self.info.in_shape, self.info.num_classes,
                                               cfg.model.width, cfg.model.depth)
        loss_fn = resolve_loss(cfg.job.loss)
        model = model.to(run.device)
        opt = build_optimizer(model.parameters(), cfg)
        model, prepared, loader = run.prepare(model, opt, self.training_data(), data_info=self.info)
        opt = prepared or opt  # ZeRO's wrapper when strategy.shard_optimizer
        # A torchrun restart resumes by itself: every attempt after the first continues from the newest checkpoint.
        resume = self.resume or ("auto" if run.restarts > 0 and cfg.checkpoint.dir else None)
        if resume:
            run.load(cfg.checkpoint.dir if resume == "auto" else resume)
        self.run, self.model = run, model  # the prepared model stays readable after fit()
        for x, y in run.batches(loader, steps=cfg.job.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(run.step_count, cfg.optim, run.global_batch, cfg.job.steps)
            run.forward_backward(x, y, loss_fn)  # pipelined: every micro-batch through the stages
            if cfg.optim.clip_grad_norm:
                run.clip_gradients(cfg.optim.clip_grad_norm)
            if not run.step():
                continue
            if cfg.job.eval_every and run.step_count % cfg.job.eval_every == 0 and run.step_count < run.total_steps:
                with run.untimed():
                    self._evaluate()
            run.checkpoint()  # when checkpoint.every says
        if run.preempted:  # SIGTERM: the checkpoint of this step, then a summary that says so
            if cfg.checkpoint.dir:
                run.checkpoint(force=True)
            else:
                logger.warning("preempted without checkpoint.dir: the steps done so far are lost")
            run.end_training()
        else:
            run.end_training()  # local SGD's replicas averaged: evaluation and the checkpoint see one model
            self._evaluate()
            run.checkpoint(final=True)
        name = cfg.model.name if self.user_model is None else type(self.user_model).__name__
        return run.finish({"model": name, "data": data_name})

    def training_data(self) -> Any:
        """What the run loads training batches from: the data set (a subclass may hand over a loader instead)."""
        return self.train_data

    def _evaluate(self) -> tuple[float, float, int]:
        run, cfg = self.run, self.cfg
        if self.eval_data is None or len(cast(Sized, self.eval_data)) == 0:
            return float("nan"), float("nan"), 0
        loss_fn = resolve_loss(cfg.job.loss)
        batches = None
        if cfg.job.loss == "cross_entropy" and self.info is not None:  # built-in image data: normalised on the device, like training batches
            batches = eval_batches(self.eval_data, self.info, run.device, cfg.data.batch_size, run.env.rank,
                                   run.env.world_size)
        r = run.evaluate(self.eval_data, loss_fn, batches=batches)
        logger.info(f"eval at step {run.step_count}: loss {r['loss']:.4f}  accuracy {r['accuracy']:.4f}  "
                    f"({r['samples']} samples)")
        return r["loss"], r["accuracy"], int(r["samples"])
