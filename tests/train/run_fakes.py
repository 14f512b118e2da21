"""Small stand-ins for the run's components' unit tests: a one-rank group, a guard that records, and a strategy
over a tiny plain module that exchanges nothing (the run's components only call these seams)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainscale.config import Config, JobConfig
from trainscale.distributed import DistEnv, init_distributed, shutdown
from trainscale.train.instruments import Instruments
from trainscale.train.instruments.flops import FlopMeter
from trainscale.train.instruments.losses import LossWindow
from trainscale.train.report.logpoints import LogPoints
from trainscale.train.state import Meters, Prepared, RunContext, RunState


def one_rank_group() -> Any:
    """A one-process Gloo group (the components' collectives need one), ended after the test."""
    env = init_distributed(JobConfig(threads=1))
    yield env
    shutdown()


class RecordingGuard:
    """The guard's seams as the components call them, recorded; ``stop_at``: the step a SIGTERM stops at."""

    attempt = 0

    def __init__(self, stop_at: int | None = None):
        self.stop_at = stop_at
        self.marks: list[tuple[str, int]] = []
        self.resumed_at: int | None = None

    def mark(self, phase: str, step: int, detail: str = "") -> None:
        self.marks.append((phase, step))

    def at_boundary(self, step: int) -> bool:
        return self.stop_at is not None and step >= self.stop_at

    def in_checkpoint(self, step: int) -> None:
        pass

    def record_resume(self, step: int) -> None:
        self.resumed_at = step

    def steps_redone(self, start_step: int) -> int:
        return 0


class PlainStrategy:
    """A strategy over a bare module on one process: nothing exchanged, no scaling, the module's own state."""

    pipelined = False
    syncs_gradients = False
    amp = False

    def __init__(self, module: nn.Module):
        self.module = self.model = module
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)
        self.steps = 0
        self.grad_sync: list[bool] = []

    # the step
    def data_shard(self, rank: int, world: int) -> tuple[int, int]:
        return rank, world

    def set_grad_sync(self, on: bool, comm: bool = True) -> None:
        self.grad_sync.append(on)

    def autocast(self) -> Any:
        return nullcontext()

    def no_sync(self) -> Any:
        return nullcontext()

    def sync_gradients(self) -> None:
        pass

    def clip_grad_norm(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        return nn.utils.clip_grad_norm_(self.module.parameters(), max_norm, norm_type)

    def after_optimizer_step(self) -> None:
        pass

    def end_step(self) -> None:
        self.steps += 1

    def share_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    # checkpoints
    def gather_model(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])

    def model_state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_model_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer, rank: int) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state)

    # the summary
    def report(self, optimizer: torch.optim.Optimizer, warm: int, no_comm: bool) -> dict[str, Any]:
        return {"allreduce_calls_per_step": 0}


def context(env: DistEnv, out: Path, cfg: Config | None = None, guard: Any = None) -> RunContext:
    """The holders a run gives its components, for ``cfg`` (default: ``Config()``) on this one-rank group."""
    cfg = cfg or Config()
    meters = Meters(LossWindow(env.device, cfg.log.every), FlopMeter(env.device, cfg.strategy.amp),
                    LogPoints(cfg, False, None, out))
    return RunContext(cfg, env, guard or RecordingGuard(), RunState(total_steps=cfg.job.steps), meters, out)


def parts(ctx: RunContext, module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> Prepared:
    """A plain strategy over ``module``, the optimizer, and the instruments ``ctx.cfg`` asks for."""
    env = ctx.env
    ins = Instruments(ctx.cfg, env.rank, env.is_main, env.device, module, ctx.out_dir)
    return Prepared(PlainStrategy(module), optimizer, ins)
