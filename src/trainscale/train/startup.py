"""The collective steps of ``run.prepare`` around the strategy: the instruments, the environment table, the seeds."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from ..distributed import DistEnv, gather_env_rows
from ..distributed.table import print_env_table
from ..strategies import Strategy
from .instruments import Instruments, start_accounting
from .state import RunContext
from .survive.guard import Guard

__all__ = ["build_instruments", "announce", "seed_rank"]


def build_instruments(ctx: RunContext, st: Strategy) -> Instruments:
    """The run's instruments on the strategy's module: only the active ones (collective with accounting on).

    Example::

        ins = build_instruments(ctx, strategy)
    """
    cfg, env, guard = ctx.cfg, ctx.env, ctx.guard
    # The accounting's clock offsets are measured through the store: every rank is here (prepare is collective).
    acct = start_accounting(env.rank, env.world_size, guard.store, st.meter, env.device.type,
                            guard.attempt) if cfg.log.accounting else None
    ins = Instruments(cfg, env.rank, env.is_main, env.device, st.module, ctx.out_dir, acct)
    if cfg.log.stragglers and env.world_size > 1 and not st.pipelined:  # pipeline stages differ by design
        ins.watch_stragglers(guard.side_store(), env.world_size, guard.attempt)
    return ins


def announce(env: DistEnv, guard: Guard, st: Strategy) -> None:
    """Every rank's environment row gathered (collective), the watchdog started, the table printed once.

    Example::

        announce(env, guard, strategy)  # on every rank, after the strategy is applied
    """
    rows = gather_env_rows(env)
    st.label_rows(rows)
    guard.start()  # every rank has published its first beat before that collective
    if env.is_main and (st.pipelined or not os.environ.get("TRAINSCALE_TABLE_PRINTED")):
        print_env_table(rows, world=str(env.world_size), nodes=str(env.nnodes), master=env.master,
                        backend=env.backend, source=env.cluster)


def seed_rank(seed: int, rank: int) -> None:
    """Each rank its own stream of randomness from here (dropout, augmentation), reproducible from the seed.

    Example::

        seed_rank(cfg.job.seed, env.rank)
    """
    s = seed * 1000 + rank
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)
