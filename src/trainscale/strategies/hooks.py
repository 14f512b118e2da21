"""DDP communication hooks: several communicators, hierarchical all-reduce, compression, counted.

Every hook has the DDP signature ``hook(state, bucket) -> Future[Tensor]`` and a small ``__slots__``
state. Compression reuses PyTorch's own hooks and wrappers (``default_hooks.fp16_compress_wrapper``,
``powerSGD_hook``, ``post_localSGD_hook``); the transport hooks here only choose process groups.
"""

# No ``from __future__ import annotations`` here: DDP checks a hook's ``bucket: dist.GradBucket`` annotation
# against the class itself, which a string annotation fails.
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ..config import ConfigError, StrategyConfig
from ..distributed import DistEnv
from ..distributed.env import node_members
from ..log import logger
from .checks import node_size
from .comm import CommMeter

__all__ = ["NodeGroups", "node_groups", "FlatState", "flat_hook", "HierState", "hierarchical_hook",
           "CountedState", "CastState", "cast_hook", "counted_powersgd_hook", "counted_post_local_sgd_hook", "CommHooks"]

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future]
# torch 2.13 renamed the tensor forms of reduce-scatter and all-gather (the old names warn).
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


class NodeGroups:
    """This rank's node groups (ranks on the same node) and cross group (same local rank on every node).

    The node level has two groups, one for the reduce-scatter and one for the all-gather: on Gloo the
    all-gather of bucket i is issued from a waiter thread while backward issues the reduce-scatter of
    bucket i+1, and collectives on one group must come in the same order on every rank.
    """

    __slots__ = ("local", "local_gather", "cross", "local_size", "nnodes")

    def __init__(self, local: dist.ProcessGroup, local_gather: dist.ProcessGroup, cross: dist.ProcessGroup,
                 local_size: int, nnodes: int):
        self.local, self.local_gather, self.cross = local, local_gather, cross
        self.local_size, self.nnodes = local_size, nnodes


def node_groups(world: int, local_size: int, members: list[list[int]] | None = None) -> NodeGroups:
    """Build node and cross groups (collective: call on every rank).

    ``members``: each node's ranks as the launcher placed them (``node_members``); None: nodes of ``local_size``
    consecutive ranks (``strategy.local_size``, which emulates nodes on one machine).
    """
    nodes = members or [list(range(n * local_size, (n + 1) * local_size)) for n in range(world // local_size)]
    # new_subgroups_by_enumeration creates every group on every rank, in the same order, as new_group requires.
    local, _ = dist.new_subgroups_by_enumeration(nodes)
    local_gather, _ = dist.new_subgroups_by_enumeration(nodes)
    cross, _ = dist.new_subgroups_by_enumeration([[node[i] for node in nodes] for i in range(local_size)])
    return NodeGroups(local, local_gather, cross, local_size, len(nodes))


def _node_layout(env: DistEnv, cfg: StrategyConfig) -> tuple[int, list[list[int]] | None]:
    """(processes per node, each node's ranks): ``strategy.local_size`` when set, else the launcher's nodes."""
    if cfg.local_size:
        return node_size(cfg, env.world_size, env.local_world_size), None
    members = node_members(env)
    sizes = sorted({len(m) for m in members})
    if len(sizes) > 1:
        raise ConfigError("strategy.hierarchical", True, f"needs nodes of equal size; the launcher's nodes have "
                          f"{', '.join(str(len(m)) for m in members)} processes; set strategy.local_size")
    return sizes[0], members


def _tensor_future(work: dist.Work) -> torch.futures.Future[torch.Tensor]:
    return work.get_future().then(lambda f: f.value()[0])


class FlatState:
    """Groups spanning all ranks; bucket i goes to group i mod k, so k buckets can be in flight at once."""

    __slots__ = ("groups", "world", "meter")

    def __init__(self, groups: list[dist.ProcessGroup | None], world: int, meter: CommMeter):
        self.groups, self.world, self.meter = groups, world, meter


def flat_hook(state: FlatState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over all ranks on one of ``state.groups`` (what DDP does, on a chosen communicator)."""
    buf = bucket.buffer()
    group = state.groups[bucket.index() % len(state.groups)]
    buf.div_(state.world)  # before the sum, so fp16 does not overflow
    state.meter.collective("all_reduce", buf.numel() * buf.element_size(), state.world)
    return _tensor_future(dist.all_reduce(buf, group=group, async_op=True))


class HierState:
    """(node group, cross group) pairs; bucket i uses pair i mod k."""

    __slots__ = ("pairs", "world", "meter", "waiter")

    def __init__(self, pairs: list[NodeGroups], world: int, meter: CommMeter):
        self.pairs, self.world, self.meter = pairs, world, meter
        self.waiter: ThreadPoolExecutor | None = None


def _chain(state: HierState, work: dist.Work, then: Callable[[], torch.Tensor]) -> torch.futures.Future[torch.Tensor]:
    """Run ``then`` once ``work`` is done, without blocking backward.

    NCCL's reduce-scatter has a future to chain on (and its callbacks keep CUDA stream order). Gloo's has
    none ("Work::getFuture not implemented"): one waiter thread per hook state waits for it instead.
    """
    try:
        return work.get_future().then(lambda _: then())
    except RuntimeError:
        pass
    if state.waiter is None:
        state.waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainscale-hier")
    out: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def finish() -> None:
        try:
            work.wait()
            out.set_result(then())
        except Exception as e:  # reaches DDP's wait in backward, which raises it on the training thread
            out.set_exception(e)  # type: ignore[arg-type]  # torch annotates the exception as the result type T

    state.waiter.submit(finish)
    return out


def hierarchical_hook(state: HierState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Reduce-scatter inside the node, all-reduce each shard across nodes, all-gather inside the node."""
    buf = bucket.buffer()
    g = state.pairs[bucket.index() % len(state.pairs)]
    ls = g.local_size
    n = buf.numel()
    padded = -(-n // ls) * ls
    # The collectives need equal shards: pad the bucket to a multiple of the node size.
    flat = buf if padded == n else torch.cat([buf, buf.new_zeros(padded - n)])
    flat.div_(state.world)
    shard = flat.new_empty(padded // ls)
    esize, meter = flat.element_size(), state.meter
    meter.collective("reduce_scatter", padded * esize, ls)
    meter.collective("all_reduce", shard.numel() * esize, g.nnodes)
    meter.collective("all_gather", padded * esize, ls)

    def across() -> torch.Tensor:
        # Waiting inside a callback chains the next collective, as PyTorch's PowerSGD hook does.
        dist.all_reduce(shard, group=g.cross, async_op=True).wait()
        _all_gather(flat, shard, group=g.local_gather, async_op=True).wait()
        if padded != n:
            buf.copy_(flat[:n])
        return buf

    return _chain(state, _reduce_scatter(shard, flat, group=g.local, async_op=True), across)


class CountedState:
    """A PyTorch hook's own state plus the meter that counts what it sends."""

    __slots__ = ("inner", "meter", "world", "subgroup_size")

    def __init__(self, inner: Any, meter: CommMeter, world: int, subgroup_size: int = 1):
        self.inner, self.meter, self.world, self.subgroup_size = inner, meter, world, subgroup_size

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume the wrapped state's iteration counter (post-local SGD switches to local steps by it)."""
        if hasattr(self.inner, "start_localSGD_iter"):
            self.inner.iter = int(state["steps"])


def counted_powersgd_hook(state: CountedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PyTorch's ``powerSGD_hook``; bytes from its own element counter (P, Q and the uncompressed tensors)."""
    ps = state.inner
    vanilla = ps.iter < ps.start_powerSGD_iter
    before = ps.total_numel_after_compression
    fut = powerSGD_hook.powerSGD_hook(ps, bucket)
    esize = bucket.buffer().element_size()
    if vanilla:
        state.meter.collective("all_reduce", bucket.buffer().numel() * esize, state.world)
    else:  # three all-reduces: uncompressed tensors, Ps, Qs
        sent = ps.total_numel_after_compression - before
        state.meter.collective("all_reduce", sent * esize, state.world, calls=3)
        if not bucket.buffer().is_cuda:
            # On Gloo the hook's later all-reduces are issued from Gloo's callback threads while backward
            # issues the next bucket's: their order can differ between ranks and the job hangs (seen with
            # several buckets). Finishing each bucket's chain here keeps one order; CUDA keeps its overlap.
            fut.wait()
    return fut


def counted_post_local_sgd_hook(state: CountedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PyTorch's ``post_localSGD_hook``: global all-reduce during warm-up, then the node group's or nothing."""
    ls = state.inner
    nbytes = bucket.buffer().numel() * bucket.buffer().element_size()
    if ls.iter < ls.start_localSGD_iter:
        state.meter.collective("all_reduce", nbytes, state.world)
    elif ls.post_local_gradient_allreduce:
        state.meter.collective("all_reduce", nbytes, state.subgroup_size)
    return post_localSGD_hook.post_localSGD_hook(ls, bucket)


class CastState:
    """The transport hook's state and the dtype gradients travel in."""

    __slots__ = ("inner", "hook", "dtype")

    def __init__(self, inner: Any, hook: Hook, dtype: torch.dtype):
        self.inner, self.hook, self.dtype = inner, hook, dtype


def cast_hook(state: CastState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PyTorch's ``fp16/bf16_compress_wrapper`` for any dtype and backend.

    PyTorch's bf16 wrapper is refused by ``register_comm_hook`` unless the backend is NCCL, yet Gloo
    reduces bf16 too; this is the same cast, send, cast back, usable on both.
    """
    bucket.set_buffer(bucket.buffer().to(state.dtype))
    fut = state.hook(state.inner, bucket)

    def decompress(f: torch.futures.Future) -> torch.Tensor:
        out = bucket.buffer()
        out.copy_(f.value())  # in place: the fp32 copy is written by DDP from this tensor
        return out

    return fut.then(decompress)


class CommHooks:
    """Builds the process groups once and registers the configured hook on a DDP module (again after a re-wrap)."""

    __slots__ = ("cfg", "env", "meter", "flat", "hier", "nodes")

    def __init__(self, env: DistEnv, cfg: StrategyConfig, meter: CommMeter):
        self.cfg, self.env, self.meter = cfg, env, meter
        self.flat: list[dist.ProcessGroup | None] = [None]
        self.hier: list[NodeGroups] = []
        self.nodes: NodeGroups | None = None
        world = env.world_size
        k = cfg.comm_groups
        if cfg.hierarchical:
            ls, members = _node_layout(env, cfg)
            self.hier = [node_groups(world, ls, members) for _ in range(k)]
            self.nodes = self.hier[0]
            layout = " ".join(map(str, members)) if members else f"{ls} consecutive ranks each (strategy.local_size)"
            logger.info(f"hierarchical all-reduce over {world // ls} node(s): {layout}")
            if ls in (1, world):
                logger.info(f"hierarchical all-reduce with {world // ls} node(s) of {ls}: one level does all the work")
        elif k > 1:
            # Extra communicators over all ranks: new_group is collective, every rank makes each in order.
            self.flat = [None] + [dist.new_group(backend=env.backend) for _ in range(k - 1)]

    def register(self, ddp: DDP) -> Any:
        """Register the configured hook on ``ddp``; returns its state (None: DDP's built-in all-reduce)."""
        cfg, world, meter = self.cfg, self.env.world_size, self.meter
        if cfg.local_sgd_period:
            nodes = self.nodes
            inner = post_localSGD_hook.PostLocalSGDState(
                process_group=None, subgroup=nodes.local if nodes else None,
                start_localSGD_iter=cfg.local_sgd_warmup, post_local_gradient_allreduce=nodes is not None)
            state: Any = CountedState(inner, meter, world, nodes.local_size if nodes else 1)
            ddp.register_comm_hook(state, counted_post_local_sgd_hook)
            return state
        if cfg.compression == "powersgd":
            power = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=cfg.powersgd_rank,
                start_powerSGD_iter=cfg.powersgd_warmup)
            state = CountedState(power, meter, world)
            ddp.register_comm_hook(state, counted_powersgd_hook)
            return state
        if not (cfg.hierarchical or cfg.comm_groups > 1 or cfg.compression != "none"):
            return None
        hook: Hook
        if cfg.hierarchical:
            state, hook = HierState(self.hier, world, meter), hierarchical_hook
        else:
            state, hook = FlatState(self.flat, world, meter), flat_hook
        if cfg.compression == "fp16":
            hook = default_hooks.fp16_compress_wrapper(hook)
        elif cfg.compression == "bf16":
            state, hook = CastState(state, hook, torch.bfloat16), cast_hook
        ddp.register_comm_hook(state, hook)
        return state
