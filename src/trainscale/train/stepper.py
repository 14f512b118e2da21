"""The step's seams on the prepared model: backward with the loss scaler, the pipeline's schedule, clipping,
the gradient exchange that waits for the step, and the optimizer step with its log point."""

from __future__ import annotations

from typing import Any

import torch

from .errors import RunError
from .feed.batches import Feed
from .prepared import PreparedModel
from .state import Prepared, RunContext

__all__ = ["Stepper"]

_NO_OPTIMIZER = "run.{}() needs the optimizer: pass it to run.prepare(model, optimizer, ...)"


class Stepper:
    """One optimizer step's seams, built by ``run.prepare``: ``Run.backward``, ``clip_gradients``, ``step`` delegate here.

    Example::

        stepper = Stepper(ctx, Prepared(strategy, optimizer, instruments), feed)
        stepper.backward(loss_fn(stepper.model(x), y))
        stepper.step()
    """

    def __init__(self, ctx: RunContext, parts: Prepared, feed: Feed):
        self.parts, self.feed = parts, feed
        self.strategy, self.optimizer, self.instruments = parts.strategy, parts.optimizer, parts.instruments
        self.state, self.meters = ctx.state, ctx.meters
        self.accum = ctx.cfg.strategy.grad_accum  # micro-batches per optimizer step
        self.model = PreparedModel(parts.strategy, cast_outputs=ctx.cfg.strategy.amp_cast_outputs)  # the user's handle

    def forward_backward(self, x: Any, y: Any, loss_fn: Any) -> torch.Tensor | None:
        """``backward(loss_fn(model(x), y))``, or, pipelined, every micro-batch through the schedule."""
        st = self.strategy
        if not st.pipelined:
            loss = loss_fn(self.model(x), y)
            self.backward(loss)
            return loss
        loss = st.pipeline_step(x, y, loss_fn, self.optimizer)
        self.instruments.clock.add(st.compute_s())  # the stages time their own compute
        self.meters.losses.add(loss if loss is not None else torch.zeros((), device=self.instruments.device))
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` with the loss scaler (fp16), accumulation and the instruments."""
        st, accum = self.strategy, self.accum
        if not torch.is_tensor(loss) or loss.numel() != 1:
            shape = tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__
            raise RunError(f"run.backward: the loss must be a scalar tensor, got {shape}; reduce it (e.g. .mean())")
        self.model._end_autocast()  # the loss is computed: backward runs outside autocast, as PyTorch's recipe says
        loss = loss / accum if accum > 1 else loss
        scaled = st.scaler.scale(loss)
        self.instruments.watch(scaled)
        scaled.backward()
        if st.syncs_gradients:
            st.backward_done()
        self.meters.losses.add(loss)

    def clip_gradients(self, max_norm: float, norm_type: float) -> torch.Tensor | None:
        """The whole model's gradients exchanged, unscaled and clipped; None on a micro-batch mid-accumulation."""
        self.model._end_autocast()
        if not self.state.last_micro(self.accum):
            return None  # the gradients are not complete yet
        if self.optimizer is None:
            raise RunError(_NO_OPTIMIZER.format("clip_gradients"))
        self.sync_gradients()
        self.strategy.scaler.unscale_(self.optimizer)  # no-op scale without fp16; step() then skips unscaling again
        return self.strategy.clip_grad_norm(max_norm, norm_type)

    def no_sync(self) -> Any:
        """The strategy's context that skips the gradient exchange, refused where it would be wrong."""
        accum = self.accum
        if self.strategy.pipelined:
            raise RunError("run.no_sync() under a pipeline: the schedule accumulates its micro-batches itself; "
                           "use --strategy.grad_accum N and run.forward_backward instead")
        if accum > 1:
            raise RunError(f"run.no_sync() with strategy.grad_accum = {accum}: the run accumulates already; "
                           "use one or the other (grad_accum 1 with your own micro-steps)")
        return self.strategy.no_sync()

    def sync_gradients(self) -> None:
        """The exchange that waits for the step (overlap off), once per optimizer step."""
        if not self.state.synced and not self.state.mode.no_comm:
            self.strategy.sync_gradients()
        self.state.synced = True

    def step(self) -> bool:
        """The optimizer step on the last micro-batch of an accumulation; whether one was taken."""
        st, ins, state, opt = self.strategy, self.instruments, self.state, self.optimizer
        self.model._end_autocast()
        state.micro += 1
        if state.micro < self.accum:
            return False
        state.micro = 0
        if (job := self.meters.flops.at_step()) is not None:
            self.meters.points.set_flops(*job)
        ins.step_called()
        mode = state.mode
        if opt is None:
            raise RunError(_NO_OPTIMIZER.format("step"))
        self.sync_gradients()  # overlap off: the exchange happens here, after backward
        state.synced = False
        ins.optimizer_starts()
        st.scaler.step(opt)
        st.scaler.update()
        if not mode.no_comm:
            st.after_optimizer_step()  # local SGD's averaging: before zero_grad (it averages trained parameters)
        opt.zero_grad(set_to_none=True)
        st.end_step()
        state.step_count += 1
        ins.step_done(state.step_count - state.start_step, mode)
        self._log_point()
        return True

    def _log_point(self) -> None:
        """At a log point, the loss window closes; the windows whose loss has reached the host go to the progress
        line, metrics.jsonl and the tracker (the one before this, or this one at the last step)."""
        state, ins = self.state, self.instruments
        last = state.step_count == state.total_steps
        point = self.meters.losses.step_done(state.step_count, last, self.strategy.share_loss)
        if point is not None:
            point["wait_s"] = ins.take_window_wait()
            point["scores"] = ins.scores()
            self._log_ready(last)

    def _log_ready(self, final: bool) -> None:
        for point in self.meters.losses.ready(final):
            self.meters.points.log(point["step"], point, self.feed.global_batch, point["wait_s"], point["scores"])

    def end_loop(self) -> None:
        """The loop ended (at its last step or early): no autocast region left open, every closed window logged."""
        self.model._end_autocast()
        self._log_ready(final=True)
