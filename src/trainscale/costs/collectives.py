"""All-reduce cost models: bytes on the wire and alpha-beta times for ring, tree and hierarchical.

Pure functions (no torch), and the one home of every bytes formula: the strategies' meters and the
parameter server's report import them from here. Sizes in bytes, times in seconds, bandwidths in bytes/s.
The shapes follow the bandwidth-optimal ring (Patarasuk and Yuan, 2009: each worker sends 2N(P-1)/P in an
all-reduce) and NCCL's own tuning model (a base latency plus a latency per hop of each link class; bus
bandwidth = algorithm bandwidth x 2(n-1)/n).

Example::

    ring_time(100e6, 8, alpha=10e-6, beta=1 / 12e9)   # 100 MB over 8 ranks of PCIe 3
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["collective_bytes", "ring_bytes_per_worker", "ring_bytes_total", "ps_bytes_at_server", "bus_bandwidth", "ring_time", "tree_time",
           "hierarchical_time", "nccl_ring_time", "AlphaBeta"]


@dataclass(frozen=True)
class AlphaBeta:
    """``t(n bytes) = alpha + beta * n``: one collective's latency and inverse bandwidth."""

    alpha: float  # seconds per call, independent of size
    beta: float   # seconds per byte

    def time(self, nbytes: float) -> float:
        """Seconds for one call of ``nbytes``."""
        return self.alpha + self.beta * nbytes if nbytes > 0 else 0.0


# What one rank sends per byte of the full tensor, times (P-1)/P, in a ring: an all-reduce is a
# reduce-scatter followed by an all-gather.
_RING_FACTOR = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}


def collective_bytes(kind: str, nbytes: float, p: int) -> float:
    """Bytes one rank sends for collective ``kind`` (all_reduce, reduce_scatter, all_gather) of ``nbytes`` over P.

    Gloo and NCCL may pick other algorithms (tree, halving-doubling); the ring volume is the bandwidth-optimal
    one they all approach.
    """
    return _RING_FACTOR[kind] * nbytes * (p - 1) / p if p > 1 else 0.0


def ring_bytes_per_worker(nbytes: float, p: int) -> float:
    """Bytes each worker sends in a ring all-reduce: 2N(P-1)/P (reduce-scatter + all-gather)."""
    return collective_bytes("all_reduce", nbytes, p)


def ring_bytes_total(nbytes: float, p: int) -> float:
    """Bytes over all links of a ring all-reduce: 2N(P-1), the same total as a parameter server's."""
    return ring_bytes_per_worker(nbytes, p) * p


def ps_bytes_at_server(nbytes: float, learners: int) -> float:
    """Bytes through one parameter server per synchronous update: each learner pushes N and pulls N, 2N x learners.

    The lecture figure 2N(P-1) counts P processes of which one is the server, so P-1 learners: the same
    formula. trainscale's server is an actor of its own beside P learners, so it moves 2NP; the parameter
    server's runs measure that (``bytes_per_update`` in ``trainscale ps`` reports).
    """
    return 2.0 * nbytes * learners


def bus_bandwidth(alg_bw: float, p: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: algorithm bandwidth x 2(n-1)/n."""
    return alg_bw * 2.0 * (p - 1) / p if p > 1 else 0.0


def ring_time(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Ring all-reduce: 2(P-1) steps of latency ``alpha`` each, 2N(P-1)/P bytes at ``beta`` s/byte."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (p - 1) * alpha + ring_bytes_per_worker(nbytes, p) * beta


def tree_time(nbytes: float, p: int, alpha: float, beta: float) -> float:
    """Double binary tree (reduce then broadcast, pipelined): 2 log2(P) hops, about 2N bytes per link."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * alpha + 2.0 * nbytes * beta


def hierarchical_time(nbytes: float, local: int, nodes: int, intra: AlphaBeta, inter: AlphaBeta) -> float:
    """Intra-node reduce-scatter, inter-node ring all-reduce of one shard, intra-node all-gather.

    ``intra``/``inter`` are per-hop alpha and per-byte beta of the two link classes.
    """
    if local * nodes <= 1 or nbytes <= 0:
        return 0.0
    t = 0.0
    if local > 1:  # reduce-scatter and all-gather each move N(L-1)/L per rank in L-1 steps
        t += 2 * ((local - 1) * intra.alpha + nbytes * (local - 1) / local * intra.beta)
    if nodes > 1:
        t += ring_time(nbytes / local, nodes, inter.alpha, inter.beta)
    return t


def nccl_ring_time(nbytes: float, local: int, nodes: int, intra_bw: float, intra_hop_s: float,
                   inter_bw: float, inter_hop_s: float, base_s: float) -> float:
    """NCCL's tuning model of a flat ring over ``nodes`` x ``local`` GPUs.

    Latency: base + hops x per-hop latency, where a ring all-reduce makes 2(n-1) steps of which 2 x nodes
    cross the network (NCCL ``tuning.cc``). Bandwidth: the ring runs at its slowest link; a node's NIC is
    crossed once in and once out per ring, so the inter-node link bounds a multi-node ring.
    """
    n = local * nodes
    if n <= 1 or nbytes <= 0:
        return 0.0
    inter_steps = 2 * nodes if nodes > 1 else 0
    latency = base_s + (2 * (n - 1) - inter_steps) * intra_hop_s + inter_steps * inter_hop_s
    bw = min(intra_bw, inter_bw) if nodes > 1 else intra_bw
    if local == 1 and nodes > 1:
        bw = inter_bw
    return latency + ring_bytes_per_worker(nbytes, n) / bw
