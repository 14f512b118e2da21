"""Forecast: a job (one device's measured or estimated step) on a cluster with a strategy -> one point
per world size (step time split into compute, exposed communication, bubble and straggler wait).

The model (``Job``, ``ClusterSpec``, ``StrategySpec``) is plain data; ``forecast`` is a pure function of it.

Example::

    job = Job("vgg16", params=138_357_544, batch_size=32, step_s=32 / 154, compute_s=32 / 154)
    cluster = ClusterSpec.from_catalog("P100", gpus_per_node=4, intra="pcie3", inter="25gbe")
    [p.efficiency for p in forecast(job, cluster, StrategySpec(bucket_mb=64), [4, 512])]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import ConfigError
from .collectives import AlphaBeta, hierarchical_time, nccl_ring_time, ring_time, tree_time
from .fsdp import fsdp_step, half_allreduce, transformer_units
from .hardware import Link, catalog, link
from .host import shared_step_s, slowdown_at, thread_slowdown
from .order_stats import expected_max_normal, predicted_update_time, sigma_from_spread
from .step import (
    compressed_bytes,
    exposed_comm,
    input_bound_step,
    make_buckets,
    pipeline_bubble,
    profile_tensors,
    ready_at,
)
from .topology import Topology

__all__ = ["Job", "ClusterSpec", "StrategySpec", "Point", "forecast", "world_sizes", "PS_MODES"]

PS_MODES = ("sync", "k-sync", "k-batch-sync", "async", "k-async", "k-batch-async")


@dataclass
class Job:
    """One device's step of the job, measured (calibration, ``--samples-per-s-1``) or estimated (FLOPs)."""

    name: str
    params: int                     # parameters whose gradients are exchanged
    batch_size: int                 # samples per device per step
    step_s: float                   # one device's whole step (compute + optimizer + loop)
    compute_s: float                # its forward + backward part
    backward_share: float = 2 / 3   # of compute_s; backward ~ 2x forward (the 6N FLOPs rule, Kaplan et al. 2020)
    spread: float = 0.0             # (p90 - p10) / median of per-step compute: the straggler noise
    bytes_per_param: int = 4        # fp32 gradients
    tensor_bytes: list[float] = field(default_factory=list)  # gradient tensors in backward order (empty: profile)
    tensor_costs: list[float] | None = None  # each tensor's share of backward time (None: by bytes)
    buffer_bytes: float = 0.0       # buffers broadcast from rank 0 every forward (BatchNorm statistics)
    input_samples_per_s: float | None = None  # one device's input pipeline rate (None: not a bound)
    cpu_s: float = 0.0              # CPU host: process CPU seconds per step, all threads (0: not measured)
    threads: int = 1                # CPU host: intra-op threads of the measured step
    core_share: float = 1.0         # CPU host: share of a core each thread got while measured (sharing slow-down)
    # CPU host: the data-parallel reducer's CPU seconds per step at P > 1 beyond the wire (bucket copies, division,
    # hooks), measured where the 1-device step ran without it (``plan calibrate``); 0: not measured.
    reducer_cpu_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.tensor_bytes:
            self.tensor_bytes, self.tensor_costs = profile_tensors(float(self.params * self.bytes_per_param))

    @property
    def grad_bytes(self) -> float:
        return float(sum(self.tensor_bytes))


@dataclass
class ClusterSpec:
    """Where the job runs: nodes of ``gpus_per_node`` devices, two link classes, or a calibrated host."""

    gpus_per_node: int
    intra: Link | None = None                 # between devices of a node (None on a calibrated host)
    inter: Link | None = None                 # between nodes
    base_lat_s: float = 8.4e-6                # NCCL baseLat Ring/Simple
    net_efficiency: float = 0.9               # share of the NIC's line rate a ring reaches
    device: str = "gpu"                       # gpu: compute unchanged by P; cpu: cores shared (sim/host.py)
    fitted: dict[int, AlphaBeta] = field(default_factory=dict)   # measured all-reduce per process count
    comm_cpu: dict[int, AlphaBeta] = field(default_factory=dict)  # CPU host: CPU seconds per all-reduce per rank
    share: dict[int, float] = field(default_factory=dict)        # CPU host: core share of each of P busy ranks
    single: dict[int, Job] = field(default_factory=dict)         # CPU host: the 1-process job per thread count
    cores: int = 0                            # CPU host: cores shared by the ranks
    outside: float = 0.0                      # CPU host: other programs' runnable threads (extrapolation)
    replay: dict[int, dict[str, Any]] = field(default_factory=dict)  # CPU host: P -> the job's skeleton step
    # Calibrated across nodes: processes per node -> the all-reduce (time; CPU) over every node's ranks, on
    # ``nodes_fitted`` nodes; 1 per node is the inter-node link alone.
    across: dict[int, AlphaBeta] = field(default_factory=dict)
    across_cpu: dict[int, AlphaBeta] = field(default_factory=dict)
    nodes_fitted: int = 1
    # The same for the hierarchical all-reduce as strategy.hierarchical's hook runs it (processes per node, 2 or
    # more), and world -> the skeleton step with it; empty: hierarchical is the sum of its measured parts.
    across_hier: dict[int, AlphaBeta] = field(default_factory=dict)
    across_hier_cpu: dict[int, AlphaBeta] = field(default_factory=dict)
    replay_hier: dict[int, dict[str, Any]] = field(default_factory=dict)
    mem_gbs: float = 0.0                      # GPU memory bandwidth (codec cost of compression)
    topo: Topology | None = None
    nics_per_node: int = 1                    # network adapters a node's GPUs share (DGX A100: 8, one per GPU)

    @classmethod
    def from_catalog(cls, gpu_name: str | None, gpus_per_node: int, intra: str, inter: str,
                     topo: Topology | None = None) -> ClusterSpec:
        """Links from the catalogue; with a topology the intra link is slowed to its ring's slowest hop."""
        from .hardware import gpu

        nccl = catalog()["nccl"]
        intra_link = link(intra, "--intra")
        if topo is not None:
            intra_link = topo_link(topo, intra_link)
        mem = gpu(gpu_name).mem_gbs if gpu_name else 0.0
        return cls(gpus_per_node, intra_link, link(inter, "--inter"), nccl["base_lat_us"]["ring"] * 1e-6,
                   nccl["net_efficiency"], mem_gbs=mem, topo=topo)

    def allreduce_s(self, nbytes: float, world: int, algo: str = "ring", hierarchical: bool = False) -> float:
        """Seconds of one all-reduce of ``nbytes`` over ``world`` ranks."""
        if world <= 1 or nbytes <= 0:
            return 0.0
        if self.fitted:
            local = min(world, self.gpus_per_node)
            nodes = max(1, math.ceil(world / self.gpus_per_node))
            if nodes > 1 and self.across:
                return self._across_s(nbytes, local, nodes, hierarchical)
            return _measured_ring(self.fitted, world, nbytes)
        assert self.intra is not None and self.inter is not None
        local = min(world, self.gpus_per_node)
        nodes = max(1, world // self.gpus_per_node)
        # NCCL spreads its rings over the node's adapters: L GPUs share min(L, NICs) of them.
        inter_bw = self.inter.bytes_per_s * self.net_efficiency * max(1, min(local, self.nics_per_node))
        if hierarchical and nodes > 1 and local > 1:
            intra = AlphaBeta(self.intra.hop_s, 1 / self.intra.bytes_per_s)
            # The L local ranks each run an inter-node ring on their 1/L shard at once: they share the NIC.
            inter = AlphaBeta(self.inter.hop_s, local / inter_bw)
            return self.base_lat_s + hierarchical_time(nbytes, local, nodes, intra, inter)
        if algo == "tree":
            bw = inter_bw if nodes > 1 else self.intra.bytes_per_s
            hop = self.inter.hop_s if nodes > 1 else self.intra.hop_s
            return self.base_lat_s + tree_time(nbytes, world, hop, 1 / bw)
        return nccl_ring_time(nbytes, local, nodes, self.intra.bytes_per_s, self.intra.hop_s, inter_bw,
                              self.inter.hop_s, self.base_lat_s)

    def _across_s(self, nbytes: float, local: int, nodes: int, hierarchical: bool) -> float:
        """An all-reduce over ``nodes`` calibrated nodes of ``local`` ranks: measured flat; hierarchical as measured
        (:meth:`_hier_measured_s`), else from its measured parts: the node's own all-reduce (reduce-scatter +
        all-gather) and the inter-node all-reduce, whose ``local`` concurrent rings on 1/local of the bytes each
        share the nodes' link."""
        if hierarchical and local > 1 and local in self.across_hier:
            return self._hier_measured_s(nbytes, local, nodes)
        if hierarchical and local > 1 and 1 in self.across:
            return (_measured_ring(self.fitted, local, nbytes)
                    + _measured_ring({self.nodes_fitted: self.across[1]}, nodes, nbytes))
        per_node = local if local in self.across else max(self.across)
        return _measured_ring({self.nodes_fitted * per_node: self.across[per_node]}, local * nodes, nbytes)

    def _hier_measured_s(self, nbytes: float, local: int, nodes: int) -> float:
        """The measured hierarchical all-reduce of ``local`` ranks per node, on ``nodes`` nodes.

        Measured on ``nodes_fitted`` nodes; on another count only its inter-node part changes, so the link's own
        all-reduce (``across[1]``, ring shape beyond the measured count) is moved from one count to the other.
        """
        t = self.across_hier[local].time(nbytes)
        if nodes != self.nodes_fitted and 1 in self.across:
            link = {self.nodes_fitted: self.across[1]}
            t += _measured_ring(link, nodes, nbytes) - _measured_ring(link, self.nodes_fitted, nbytes)
        return max(t, 0.0)

    def job_at(self, job: Job, world: int) -> tuple[Job, float]:
        """(the 1-device job as each of ``world`` ranks runs it, per-thread slow-down from sharing the host).

        The slow-down is against a free core: measured by the probe at ``world`` ranks, else processor sharing
        with the other programs' threads seen during calibration (sim/host.py).
        """
        if self.device != "cpu":
            return job, 1.0
        local = min(world, self.gpus_per_node)  # the ranks that share this node's cores
        threads = max(1, self.cores // local) if self.cores else 1
        base = self.single.get(threads, job)
        if local in self.share:
            return base, thread_slowdown(self.share[local])
        return base, slowdown_at(local, base.threads, self.cores or 1, self.outside)

    def comm_cpu_s(self, nbytes: float, world: int, hierarchical: bool = False) -> float:
        """CPU seconds one rank spends in an all-reduce of ``nbytes`` (0 where not measured); across calibrated
        nodes hierarchically, as measured, else its node's all-reduce and the inter-node one."""
        if world <= 1 or nbytes <= 0 or not self.comm_cpu:
            return 0.0
        local = min(world, self.gpus_per_node)
        if world > local and self.across_cpu:
            if hierarchical and local > 1 and local in self.across_hier_cpu:
                return self.across_hier_cpu[local].time(nbytes)
            if hierarchical and 1 in self.across_cpu:
                own = self.comm_cpu.get(local, self.comm_cpu[max(self.comm_cpu)]).time(nbytes) if local > 1 else 0.0
                return own + self.across_cpu[1].time(nbytes)
            return self.across_cpu.get(local, self.across_cpu[max(self.across_cpu)]).time(nbytes)
        return self.comm_cpu.get(world, self.comm_cpu[max(self.comm_cpu)]).time(nbytes)


def _measured_ring(fits: dict[int, AlphaBeta], world: int, nbytes: float) -> float:
    """An all-reduce over ``world`` ranks from fits measured per rank count: the fit itself, or beyond the
    measured counts the ring shape with the per-hop alpha and beta of the largest fit."""
    if world in fits:
        return fits[world].time(nbytes)
    p0 = max(fits)
    ab = fits[p0]
    if p0 < 2:
        return ab.time(nbytes)
    hop = ab.alpha / (2 * (p0 - 1))
    per_byte = ab.beta / (2 * (p0 - 1) / p0)
    return ring_time(nbytes, world, hop, per_byte)


def topo_link(topo: Topology, nominal: Link) -> Link:
    """The intra-node link as the topology matrix allows: the ring's slowest class (NV# = # bonded NVLinks)."""
    cls = topo.ring_bottleneck()
    classes = catalog()["topo_classes"]
    if cls.startswith("NV"):
        per = nominal.gbs / 6 if nominal.kind == "nvlink" else classes["NV"]["per_link"]
        return Link(f"{nominal.name} ({cls})", per * int(cls[2:]), nominal.hw_lat_us, "nvlink", nominal.source)
    entry = classes.get(cls, classes["SYS"])
    pci = link(entry["link"])
    base = nominal if nominal.kind == "pci" else pci
    return base.scaled(entry["efficiency"], f"{base.name} via {cls}")


@dataclass
class StrategySpec:
    """How gradients are exchanged (the ``trainscale train --strategy.*`` options and the PS modes)."""

    bucket_mb: float = 25.0          # fusion bucket; 0: one all-reduce per gradient tensor
    overlap: bool = True             # buckets all-reduced as backward produces them
    hierarchical: bool = False       # intra reduce-scatter, inter all-reduce, intra all-gather
    algo: str = "ring"               # ring or tree (flat)
    compression: str = "none"        # none, fp16, bf16, powersgd
    powersgd_rank: int = 1
    local_sgd_period: int = 0        # average parameters every H steps instead of every step's gradients
    zero1: bool = False              # shard optimizer state: an extra all-gather of parameters after the step
    ps_mode: str = ""                # a parameter-server mode instead of all-reduce
    ps_k: int = 0                    # K of the k-* modes (0: P // 2)
    ps_server_gbs: float = 0.0       # the server's link, GB/s (0: the inter link)
    pipeline_stages: int = 1
    microbatches: int = 8
    schedule: str = "1f1b"
    fsdp_units: int = 0              # FSDP (ZeRO-3) with this many equal units (blocks); 0: data parallel
    fsdp_gather_bytes: float = 4.0   # bytes per parameter all-gathered (4: fp32 parameters, 2: bf16, 1: fp8)
    fsdp_reduce_bytes: float = 4.0   # bytes per gradient reduce-scattered (4: fp32, 2: bf16 reduce_dtype)

    def label(self) -> str:
        """Short name of this strategy for tables."""
        if self.ps_mode:
            return f"ps {self.ps_mode}" + (f" K={self.ps_k or 'P/2'}" if self.ps_mode.startswith("k-") else "")
        if self.fsdp_units:
            dtypes = {4.0: "fp32", 2.0: "bf16", 1.0: "fp8"}
            gather, reduce = (dtypes.get(b, f"{b:g} B") for b in (self.fsdp_gather_bytes, self.fsdp_reduce_bytes))
            tail = "" if gather == reduce == "fp32" else f", gather {gather}, reduce {reduce}"
            return f"FSDP, {self.fsdp_units} units" + tail + ("" if self.overlap else ", no prefetch")
        parts = [f"bucket {self.bucket_mb:g} MB" if self.bucket_mb else "no fusion"]
        if not self.overlap:
            parts.append("no overlap")
        if self.hierarchical:
            parts.append("hierarchical")
        if self.algo != "ring":
            parts.append(self.algo)
        if self.compression != "none":
            parts.append(self.compression)
        if self.local_sgd_period:
            parts.append(f"local SGD H={self.local_sgd_period}")
        if self.zero1:
            parts.append("ZeRO-1")
        if self.pipeline_stages > 1:
            parts.append(f"pipeline {self.pipeline_stages}x{self.microbatches} {self.schedule}")
        return ", ".join(parts)


@dataclass
class Point:
    """The forecast at one world size (times in seconds per optimizer step)."""

    world_size: int
    nodes: int
    step_time_s: float
    samples_per_s: float
    speedup: float
    efficiency: float
    compute_s: float        # forward + backward (+ optimizer and loop) of the slowest rank's typical step
    comm_exposed_s: float   # communication not hidden behind backward
    comm_total_s: float     # all communication of the step, hidden or not
    bubble_s: float         # pipeline idle time
    straggler_s: float      # expected wait for the slowest of P ranks
    comm_overhead_s: float  # step time at P minus the 1-device step (the usual definition of communication overhead)
    bound: str              # what bounds the step: compute, communication, bubble, straggler, input, server
    strategy: str = ""
    model_step_s: float = 0.0  # the cost model's step before anchoring on a measured skeleton (0: not anchored)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def world_sizes(gpus_per_node: int, nodes: list[int]) -> list[int]:
    """Devices for each node count."""
    return [gpus_per_node * n for n in nodes]


def _bound(parts: dict[str, float]) -> str:
    return max(parts, key=lambda k: parts[k])


def _step(job: Job, cluster: ClusterSpec, s: StrategySpec, world: int) -> Point:
    """One world size (without speed-up, filled in by ``forecast``)."""
    base, slow = cluster.job_at(job, world)
    nodes = max(1, math.ceil(world / cluster.gpus_per_node))
    compute, other, sigma, straggler = _compute(base, slow, world)
    # DDP's reducer (none at one device, none under FSDP): its CPU seconds over the threads as on free cores
    # (CPU time is what the host's load does not change), at the sharing slow-down
    reducer_cpu = base.reducer_cpu_s if world > 1 and not s.fsdp_units else 0.0
    other += reducer_cpu / max(1, base.threads) * slow
    dp, bubble, tensor_bytes = _pipelined(s, world, compute, list(base.tensor_bytes))
    ratio, codec = _compression(s, tensor_bytes, cluster.mem_gbs)
    if s.ps_mode:
        return _ps_point(base, cluster, s, world, nodes, compute + other, sigma)
    exposed, total, comm_cpu = _exchange(base, cluster, s, tensor_bytes, dp, ratio, compute * base.backward_share)
    exposed += codec
    step = compute + other + exposed + bubble + straggler
    if cluster.device == "cpu" and base.cpu_s and not s.local_sgd_period:
        # A CPU host: Gloo's work takes cycles from the compute (overlap is not free), so a rank needs its
        # whole CPU time at the sharing slow-down; the step is that or the critical path, whichever is longer.
        demand = shared_step_s(base.cpu_s + reducer_cpu + comm_cpu, base.threads, slow)
        if demand > step:
            step, straggler = demand, 0.0
            compute, other = shared_step_s(base.cpu_s + reducer_cpu, base.threads, slow), 0.0
            exposed = shared_step_s(comm_cpu, base.threads, slow)
    input_step = input_bound_step(base.batch_size, base.input_samples_per_s)
    parts = {"compute": compute + other, "communication": exposed, "bubble": bubble, "straggler": straggler}
    bound = "input" if input_step > step else _bound(parts)
    step = max(step, input_step)
    samples = base.batch_size * world * (s.pipeline_stages if s.pipeline_stages > 1 else 1) / s.pipeline_stages
    return Point(world, nodes, step, samples / step, 0.0, 0.0, compute + other, exposed, total, bubble, straggler,
                 0.0, bound, s.label())


def _compute(base: Job, slow: float, world: int) -> tuple[float, float, float, float]:
    """(forward+backward, the rest of the step, its noise sigma, the expected wait for the slowest of ``world``)."""
    # The 1-device step was measured at its own sharing slow-down; each thread now runs ``slow`` times slower.
    rel = slow / thread_slowdown(base.core_share)
    compute = base.compute_s * rel
    other = max(0.0, base.step_s - base.compute_s) * rel
    sigma = sigma_from_spread(base.spread, compute)
    # On a time-shared host the sharing model gives the step; its noise is the sharing, not counted twice.
    straggler = sigma * expected_max_normal(world) if slow <= 1.0 else 0.0
    return compute, other, sigma, straggler


def _pipelined(s: StrategySpec, world: int, compute: float, tensor_bytes: list[float]) -> tuple[int, float, list[float]]:
    """(data-parallel ranks, the pipeline's bubble in seconds, the gradient bytes each rank exchanges)."""
    if s.pipeline_stages <= 1:
        return world, 0.0, tensor_bytes
    if world % s.pipeline_stages:
        raise ConfigError("--pipeline-stages", s.pipeline_stages, f"must divide the world size {world}")
    frac = pipeline_bubble(s.pipeline_stages, s.microbatches, s.schedule)
    # Each stage holds 1/S of the model.
    return world // s.pipeline_stages, compute * frac / (1 - frac), [b / s.pipeline_stages for b in tensor_bytes]


def _compression(s: StrategySpec, tensor_bytes: list[float], mem_gbs: float) -> tuple[float, float]:
    """(bytes on the wire per gradient byte, seconds the codec takes on the device per step)."""
    ratio = compressed_bytes(1.0, s.compression, s.powersgd_rank) if s.compression != "powersgd" else \
        compressed_bytes(sum(tensor_bytes), "powersgd", s.powersgd_rank) / max(1.0, sum(tensor_bytes))
    codec = 0.0
    if s.compression != "none" and mem_gbs:
        passes = 3 if s.compression in ("fp16", "bf16") else 10  # read, write, cast back; PowerSGD's matmuls
        codec = passes * sum(tensor_bytes) / (mem_gbs * 1e9)
    return ratio, codec


def _exchange(base: Job, cluster: ClusterSpec, s: StrategySpec, tensor_bytes: list[float], dp: int, ratio: float,
              backward: float) -> tuple[float, float, float]:
    """(exposed and total communication seconds per step, CPU seconds a rank spends in it) over ``dp`` ranks."""
    def t_of(nbytes: float) -> float:
        return cluster.allreduce_s(nbytes * ratio, dp, s.algo, s.hierarchical)

    if s.fsdp_units:
        return _fsdp_exchange(cluster, s, sum(tensor_bytes) / base.bytes_per_param, dp, backward / base.backward_share,
                              backward)
    buckets = make_buckets(tensor_bytes, s.bucket_mb * 1024 * 1024)
    exposed, total = exposed_comm(buckets, ready_at(buckets, tensor_bytes, backward, base.tensor_costs), t_of,
                                  backward, s.overlap)
    comm_cpu = sum(cluster.comm_cpu_s(b * ratio, dp, s.hierarchical) for b in buckets)
    if base.buffer_bytes and dp > 1:
        b = cluster.allreduce_s(base.buffer_bytes, dp) / 2  # a broadcast moves half an all-reduce
        exposed, total = exposed + b, total + b
        comm_cpu += cluster.comm_cpu_s(base.buffer_bytes, dp) / 2
    if s.local_sgd_period:
        avg = t_of(sum(tensor_bytes)) / s.local_sgd_period  # one parameter average every H steps, not hidden
        exposed, total = avg, avg
    if s.zero1:
        gather = t_of(sum(tensor_bytes)) / 2  # all-gather of the updated shards after the step
        exposed, total = exposed + gather, total + gather
    return exposed, total, comm_cpu


def _fsdp_exchange(cluster: ClusterSpec, s: StrategySpec, params: float, dp: int, compute: float,
                   backward: float) -> tuple[float, float, float]:
    """FSDP over ``dp`` ranks: each of ``s.fsdp_units`` equal blocks all-gathered before its forward and its backward
    and reduce-scattered after it, one block of prefetch (``costs/fsdp.py``), in the strategy's gather and reduce
    dtypes; without overlap nothing is prefetched and every collective is exposed. (exposed, total, CPU seconds.)"""
    if dp <= 1:
        return 0.0, 0.0, 0.0
    units = s.fsdp_units
    blocks = transformer_units(units, params / units, compute, backward_share=backward / compute if compute else 2 / 3)
    half = half_allreduce(cluster.allreduce_s, dp)
    t = fsdp_step(blocks, half, half, gather_bytes=s.fsdp_gather_bytes, reduce_bytes=s.fsdp_reduce_bytes)
    moved = params * (2 * s.fsdp_gather_bytes + s.fsdp_reduce_bytes)
    cpu = cluster.comm_cpu_s(moved, dp) / 2  # two gathers and one reduce-scatter, each half an all-reduce
    return (t.exposed_s if s.overlap else t.comm_s), t.comm_s, cpu


def _ps_point(job: Job, cluster: ClusterSpec, s: StrategySpec, world: int, nodes: int, busy_s: float,
              sigma: float) -> Point:
    """A parameter-server mode: learner times shift + Exp(sigma) (Dutta et al. 2018's model), the server's link a bound."""
    k = s.ps_k or max(1, world // 2)
    if s.ps_mode not in PS_MODES:
        raise ConfigError("--ps-mode", s.ps_mode, "one of " + ", ".join(PS_MODES))
    server_bw = (s.ps_server_gbs * 1e9) if s.ps_server_gbs else (
        cluster.inter.bytes_per_s * cluster.net_efficiency if cluster.inter else 1e9)
    push_pull = 2 * job.grad_bytes / server_bw  # one learner's push and pull through the server
    update = predicted_update_time(s.ps_mode, world, k if s.ps_mode.startswith("k-") else world, max(sigma, 1e-9),
                            busy_s + push_pull)
    grads = {"sync": world, "async": 1}.get(s.ps_mode, k)
    server = grads * 2 * job.grad_bytes / server_bw  # every gradient in and every parameter copy out
    step = max(update, server)
    bound = "server" if server >= update else ("compute" if busy_s >= push_pull else "communication")
    samples = job.batch_size * grads
    return Point(world, nodes, step, samples / step, 0.0, 0.0, busy_s, max(0.0, step - busy_s), push_pull + server,
                 0.0, max(0.0, update - busy_s - push_pull), 0.0, bound, s.label())


def _anchored(p: Point, job: Job, cluster: ClusterSpec, s: StrategySpec) -> Point:
    """On a calibrated host, the model's point scaled so the calibrated strategy gives its skeleton's measured step.

    The skeleton (``strategies/probe.py``) ran the job's CPU demand and buckets on P ranks of this host, so it saw what
    processor sharing alone does not: ranks blocked in a collective leave their cores idle, a late rank keeps the
    others waiting. The model keeps what it is for: how another strategy changes the step, relative to that.
    A hierarchical strategy is anchored on the skeleton measured with the hierarchical exchange where there is one.
    """
    hier = s.hierarchical and p.world_size in cluster.replay_hier
    r = cluster.replay_hier.get(p.world_size) if hier else cluster.replay.get(p.world_size)
    if not r or s.ps_mode or p.world_size <= 1:
        return p
    ref = _step(job, cluster, StrategySpec(bucket_mb=float(r["bucket_mb"]), overlap=bool(r["overlap"]), hierarchical=hier),
                p.world_size)
    k = float(r["step_s"]) / ref.step_time_s
    return replace(p, step_time_s=p.step_time_s * k, samples_per_s=p.samples_per_s / k, compute_s=p.compute_s * k,
                   comm_exposed_s=p.comm_exposed_s * k, comm_total_s=p.comm_total_s * k, bubble_s=p.bubble_s * k,
                   straggler_s=p.straggler_s * k, model_step_s=p.step_time_s)


def forecast(job: Job, cluster: ClusterSpec, strategy: StrategySpec, worlds: list[int]) -> list[Point]:
    """The forecast at each world size; speed-up and efficiency against one device of the same job."""
    one = _step(job, cluster, StrategySpec(), 1)
    points = []
    for w in worlds:
        p = _anchored(_step(job, cluster, strategy, w), job, cluster, strategy)
        p.speedup = p.samples_per_s / one.samples_per_s
        p.efficiency = p.speedup / w
        p.comm_overhead_s = p.step_time_s - one.step_time_s
        points.append(p)
    return points
