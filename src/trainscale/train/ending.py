"""The run's end: training ended, the summary built and shown, the process groups ended, the exit guard's call.

Each step is given the components it ends; the order inside each is decided here, and why the process
groups end last is in ``distributed/teardown.py``.
"""

from __future__ import annotations

from typing import Any

from ..config import Config
from ..distributed.teardown import end_process_group
from ..log import logger
from ..strategies import Strategy
from .checkpoint.checkpointer import Checkpointer
from .feed.batches import Feed, data_shard
from .instruments import Instruments
from .report.summary_builder import RunRecord, build_summary
from .state import Meters, Prepared, RunContext, RunState
from .summary import print_summary, write_summary
from .survive.guard import Guard

__all__ = ["end_training", "summarize", "publish", "close_at_exit", "end_groups"]


def end_training(ctx: RunContext, feed: Feed, st: Strategy | None, ins: Instruments | None) -> None:
    """After the last step: the progress line and FLOP counter end, loaders stop, instruments and strategy finish.

    Example::

        end_training(ctx, feed, strategy, instruments)  # collective with a strategy
    """
    ctx.meters.points.close_view()
    ctx.meters.flops.close()
    if ins is not None:
        ins.end_steps()  # the accounting's last read, while the loader's threads still run
    _close_io(feed, ctx.meters)
    if ins is not None:
        ins.finish(ctx.env.world_size)
    if st is not None:
        st.finish()  # real modules back, local SGD's replicas averaged


def summarize(ctx: RunContext, parts: Prepared, feed: Feed, eval_result: tuple[float, float, int],
              extra: dict[str, Any]) -> dict[str, Any]:
    """The run summary from what the run's components know at its end (collective: every rank calls it).

    Example::

        summary = summarize(ctx, parts, feed, evaluator.result, {"model": "mlp"})
    """
    state, meters, guard = ctx.state, ctx.meters, ctx.guard
    rec = RunRecord(steps=state.step_count, start_step=state.start_step, global_batch=feed.global_batch,
                    shards=data_shard(parts.strategy, ctx.env)[1], started_at=state.started_at,
                    restarts=guard.attempt, steps_redone=guard.steps_redone(state.start_step),
                    preempted=state.preempted, eval_result=eval_result, out_dir=ctx.out_dir, losses=meters.losses,
                    loader=feed.loaders[0] if feed.loaders else None, metrics_jsonl=meters.points.written,
                    flops=meters.flops.job, peak_source=meters.flops.source, extra=extra)
    return build_summary(ctx.cfg, ctx.env, parts, rec)


def publish(summary: dict[str, Any], json_path: str | None, cfg: Config) -> None:
    """Rank 0's summary: written to ``json_path`` when given, printed unless ``log.progress`` is none.

    Example::

        publish(summary, "out/run.json", cfg)
    """
    if json_path:
        write_summary(json_path, summary)
    if cfg.log.progress != "none":
        print_summary(summary)


def close_at_exit(feed: Feed, meters: Meters, ins: Instruments | None, ck: Checkpointer | None) -> None:
    """For a run that never called ``finish()``: threads and files closed, no collective (a rank may be gone).

    Example::

        close_at_exit(feed, meters, instruments, checkpointer)
        end_groups(state, owns_group, guard, holders, barrier=False)
    """
    if ins is not None:
        ins.abandon()  # the monitor's thread out of the store before the groups end
    _close_io(feed, meters)
    if ck is not None:  # an asynchronous checkpoint's writer still in a collective: let it end
        try:
            ck.wait()
        except Exception as e:
            logger.warning(f"at exit: the asynchronous checkpoint did not complete: {e}")


def end_groups(state: RunState, owns_group: bool, guard: Guard, holders: list[Any], barrier: bool) -> None:
    """The last of a run: the watchdog's thread, what holds a group, then the groups (when the run made them).

    Example::

        end_groups(state, owns_group=True, guard=guard, holders=[strategy, checkpointer], barrier=True)
    """
    state.finished = True
    # The order (threads into c10d, then what holds a group, then the groups) is decided, and why, in
    # distributed/teardown.py; the user's prepared model keeps working on the plain module.
    end_process_group(owns_group, barrier, threads=[guard.close], holders=holders)


def _close_io(feed: Feed, meters: Meters) -> None:
    feed.close()  # the prefetch thread and the worker processes
    meters.points.close()
