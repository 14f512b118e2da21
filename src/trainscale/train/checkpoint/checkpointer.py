"""The checkpointer: a component of the run that owns save, load, async writes, the ``latest`` pointer and cadence.

The run and ``Trainer`` only call it (torchtitan's checkpointer is the model): ``should_save(step)`` says when,
``save`` writes one file (rank 0, atomically) or a sharded DCP folder (every rank, asynchronously when
``checkpoint.async_save``), ``load`` finds the newest readable checkpoint and restores it. It is given what it
saves when it is built; it never calls back into the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ...config import config_to_dict
from ...log import logger
from ...strategies import Strategy
from ..state import RunContext
from .files import (
    CheckpointWriteError,
    checkpoint_candidates,
    is_sharded,
    load_checkpoint,
    prune,
    publish_latest,
    save_checkpoint,
    set_rng_state,
    state_bytes,
    warn_skipped,
    write_error,
)

__all__ = ["Checkpointer"]


class Checkpointer:
    """Checkpoints of one run: model, optimizer, loss scaler, strategy counters, step, loader position, RNGs.

    Example::

        ck = Checkpointer(ctx, strategy, optimizer, feed.loaders)
        if ck.should_save(step):
            ck.save(Path(cfg.checkpoint.dir) / f"step_{step}", step)
    """

    def __init__(self, ctx: RunContext, strategy: Strategy, optimizer: torch.optim.Optimizer | None,
                 loaders: list[Any]):
        self.cfg, self.env, self.guard = ctx.cfg, ctx.env, ctx.guard
        self.strategy, self.optimizer = strategy, optimizer
        self.loaders = loaders  # the run's list: a loader made after prepare() is saved too
        self._pending: Any = None  # an asynchronous sharded checkpoint still being written
        self._group: Any = None  # the checkpoints' own process group (async writes run beside the step)

    # ---- cadence
    def should_save(self, step: int) -> bool:
        """Whether ``checkpoint.every`` asks for a checkpoint after optimizer step ``step``."""
        ck = self.cfg.checkpoint
        return bool(ck.dir and ck.every and step % ck.every == 0)

    def path_for(self, step: int, final: bool = False) -> Path:
        """``checkpoint.dir/step_N`` (``last`` at the end), ``.pt`` when ``checkpoint.format`` is ``file``."""
        ck = self.cfg.checkpoint
        stem = "last" if final else f"step_{step}"
        return Path(ck.dir) / (stem + ".pt" if ck.format == "file" else stem)

    def save_periodic(self, step: int, final: bool = False) -> None:
        """Write ``path_for(step)`` under ``checkpoint.on_error`` (stop, or warn and train on); prune to ``keep``."""
        ck = self.cfg.checkpoint
        try:
            self.save(self.path_for(step, final), step)
        except CheckpointWriteError as e:
            if ck.on_error == "stop":
                raise
            if self.env.is_main:
                logger.warning(f"{e}; training on (checkpoint.on_error = warn)")
            return
        if self.env.is_main and not final:
            prune(Path(ck.dir), ck.keep)

    # ---- writing
    def save(self, path: str | Path, step: int, extra: dict[str, Any] | None = None) -> None:
        """Collective: ``PATH.pt`` is one file that rank 0 writes; any other name a sharded DCP folder."""
        st, path = self.strategy, Path(path)
        self.wait()
        self.guard.mark("checkpoint", step, f"writing {path.name}")
        st.gather_model()  # one whole-model state dict, whatever the stage count
        meta = {"scaler": st.scaler.state_dict(), "strategy": st.state_dict(), "step": step,
                "loader": self.loaders[0].state_dict() if self.loaders else None,
                "world_size": self.env.world_size, "config": config_to_dict(self.cfg), **(extra or {})}
        if self.optimizer is not None:
            from .dcp import param_names
            # The optimizer state_dict names parameters by index; these names let a converter map them to DCP keys.
            meta["param_names"] = param_names(st.module, self.optimizer)
        if path.suffix == ".pt":
            optim = st.optimizer_state_dict(self.optimizer, self.env.rank) if self.optimizer else {}
            state = {"model": st.model_state_dict(), "optimizer": optim, **meta}
            save_checkpoint(path, state, self.env.rank, self.env.world_size,
                            during=lambda: self.guard.in_checkpoint(step))
        else:
            self._save_sharded(path, meta, step)
        self.guard.mark("checkpoint", step, f"wrote {path.name}")

    def _save_sharded(self, path: Path, meta: dict[str, Any], step: int) -> None:
        from torch.distributed.checkpoint import CheckpointException

        from .dcp import dcp_save
        if self._group is None and self.env.world_size > 1:
            self._group = dist.new_group(backend="gloo")  # collective; async writes must not share the step's group
        if self.env.is_main:
            (path / ".metadata").unlink(missing_ok=True)  # a folder left by a crashed attempt is not complete
        self.guard.in_checkpoint(step)
        asynchronous = self.cfg.checkpoint.async_save
        try:
            fut = dcp_save(path, self.strategy.module, self.optimizer, meta, self.env.rank, self._group, asynchronous)
        except (CheckpointException, OSError) as e:
            raise self._error(path, e, meta) from None
        if fut is None:
            if self.env.is_main:
                publish_latest(path)
            return
        self._pending = (path, fut, meta)
        if asynchronous and self.env.is_main:
            logger.debug(f"writing {path} in the background")

    def _error(self, path: Path, err: BaseException, meta: dict[str, Any]) -> CheckpointWriteError:
        from .dcp import build_state
        needed = state_bytes(build_state(self.strategy.module, self.optimizer, meta, self.env.rank))
        cause: BaseException = err
        for failure in getattr(err, "failures", {}).values():  # DCP gathers every rank's exception
            cause = failure[0] if isinstance(failure, tuple) else failure
            break
        while cause.__cause__ is not None and not isinstance(cause, OSError):
            cause = cause.__cause__
        return write_error(path, cause, needed * self.env.world_size)

    def wait(self) -> None:
        """Block until an asynchronous checkpoint is complete, then publish it (collective only through DCP)."""
        if self._pending is None:
            return
        path, fut, meta = self._pending
        self._pending = None
        try:
            fut.result()
        except Exception as e:
            raise self._error(path, e, meta) from None
        if self.env.is_main:
            publish_latest(path)

    # ---- reading
    def release(self) -> None:
        """End of the run: drop the checkpoints' own group before the groups end (distributed/teardown.py)."""
        self._group = None

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore the newest readable checkpoint under ``path`` (a file, a DCP folder, or a folder of them).

        Returns the state (its ``step`` says where to go on); ``{}`` when ``path`` holds none yet.
        """
        st = self.strategy
        target = self.choose(Path(path))
        if target is None:
            logger.info(f"no checkpoint in {path}: starting from step 0")
            return {}
        rngs: list[Any] = []
        if is_sharded(target):
            from .dcp import dcp_load
            state = dcp_load(target, st.module, self.optimizer, self.env.rank, self._group)
        else:
            state = load_checkpoint(str(target))
            st.load_model_state_dict(state["model"])
            if self.optimizer is not None and state.get("optimizer"):
                st.load_optimizer_state_dict(self.optimizer, state["optimizer"])
            rngs = state.get("rng") or []
        st.scaler.load_state_dict(state["scaler"])
        st.load_state_dict(state.get("strategy") or {"steps": int(state["step"])})
        if state.get("world_size") != self.env.world_size:
            logger.warning(f"resuming a {state.get('world_size')}-process checkpoint on {self.env.world_size} "
                           "processes: the data order will differ from the original run")
        if self.loaders and state.get("loader"):
            self.loaders[0].load_state_dict(state["loader"])
        if self.env.rank < len(rngs):
            set_rng_state(rngs[self.env.rank])
        self.guard.record_resume(int(state["step"]))
        logger.info(f"resumed from {target} at step {state['step']}")
        return state

    def choose(self, path: Path) -> Path | None:
        """Rank 0 picks the newest readable checkpoint under ``path``; every rank gets its choice."""
        if path.suffix == ".pt" or is_sharded(path):
            return path
        if not path.is_dir():  # --resume auto before the first checkpoint: a fresh start
            return None
        choice: list[Any] = [None]
        if self.env.is_main:
            for cand in checkpoint_candidates(path):
                try:
                    if is_sharded(cand):
                        from .dcp import read_meta
                        read_meta(cand)
                    else:
                        load_checkpoint(cand)
                except Exception as e:
                    warn_skipped(cand, e)
                    continue
                choice[0] = str(cand)
                break
        if self.env.world_size > 1:
            dist.broadcast_object_list(choice, src=0)
        return Path(choice[0]) if choice[0] else None
