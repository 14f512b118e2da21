"""The calibration file: what ``trainscale plan calibrate`` measured, kept as JSON the user can reuse.

Pure Python: reading, checking and fitting need no torch.

Example::

    cal = Calibration.load("plan-calibration.json")
    cal.cluster().allreduce_s(4e6, 2)
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..costs.collectives import AlphaBeta
from ..costs.forecast import ClusterSpec, Job
from ..costs.host import outside_threads, share_per_thread

__all__ = ["Calibration", "fit_alpha_beta", "job_key", "SCHEMA"]

SCHEMA = "trainscale.plan.calibration/2"  # 2: CPU seconds and core shares replace contention ratios
# The options that change a step's compute or its gradients: a calibration answers only for these.
KEY_FIELDS = ("model.name", "model.width", "model.depth", "data.name", "data.batch_size", "data.image_size",
              "data.channels", "data.num_classes", "strategy.amp", "strategy.grad_accum", "optim.name")


def job_key(cfg_dict: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fields of a configuration (``config_to_dict`` form) that identify a job for the planner."""
    out = {}
    for k in KEY_FIELDS:
        sec, _, f = k.partition(".")
        out[k] = cfg_dict.get(sec, {}).get(f)
    return out


def fit_alpha_beta(points: list[tuple[float, float]]) -> tuple[AlphaBeta, float]:
    """Least-squares ``t = alpha + beta * n`` over (bytes, seconds); returns the fit and its relative RMS residual."""
    n = len(points)
    if n < 2:
        raise ValueError("need two sizes or more to fit alpha and beta")
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    beta = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    beta = max(beta, 0.0)  # noise can tilt a flat curve negative; bytes never make it faster
    alpha = max(my - beta * mx, 0.0)
    ab = AlphaBeta(alpha, beta)
    rel = [((alpha + beta * x - y) / y) ** 2 for x, y in points if y > 0]
    return ab, math.sqrt(sum(rel) / len(rel)) if rel else 0.0


def _fits(entries: dict[str, dict[str, Any]], cpu: bool = False) -> dict[int, AlphaBeta]:
    """Process count -> an entry's all-reduce fit: its seconds, or with ``cpu`` its CPU seconds (0 if not kept)."""
    if cpu:
        return {int(p): AlphaBeta(v.get("cpu_alpha", 0.0), v.get("cpu_beta", 0.0)) for p, v in entries.items()}
    return {int(p): AlphaBeta(v["alpha"], v["beta"]) for p, v in entries.items()}


@dataclass
class Calibration:
    """One job measured on one machine."""

    job: dict[str, Any]                  # job_key(...) of the calibrated options
    train_args: list[str]                # the options as given
    params: int                          # trainable parameters
    tensor_bytes: list[float]            # gradient tensors in backward order
    buffer_bytes: float                  # buffers DDP broadcasts every forward
    flops_per_step: float                # forward + backward FLOPs of one device's batch (torch flop counter)
    cores: int                           # cores the ranks share
    single: dict[str, dict[str, float]]  # threads -> {step_s, compute_s, spread, samples_per_s, cpu_s, mean_step_s}
    allreduce: dict[str, dict[str, Any]] = field(default_factory=dict)  # P -> {alpha, beta, cpu_alpha, cpu_beta, ...}
    share: dict[str, float] = field(default_factory=dict)               # P -> core share of each of P busy ranks
    replay: dict[str, dict[str, Any]] = field(default_factory=dict)     # P -> the job's skeleton step (probe.py)
    inflation: dict[str, dict[str, Any]] = field(default_factory=dict)  # P -> {factor, ...}: CPU/step at P over 1
    nnodes: int = 1                      # nodes the ``across`` probes spanned (``allreduce``: one node's own)
    across: dict[str, dict[str, Any]] = field(default_factory=dict)  # P per node -> the all-reduce over every node
    # P per node (2 or more) -> the hierarchical all-reduce over every node as the DDP hook of strategy.hierarchical
    # runs it (fitted as ``across``); world -> the skeleton step with its buckets exchanged so. Empty in files
    # written before they were measured: the forecast then adds the node's and the link's all-reduces.
    across_hier: dict[str, dict[str, Any]] = field(default_factory=dict)
    replay_hier: dict[str, dict[str, Any]] = field(default_factory=dict)
    # threads -> the data-parallel reducer's own time per step at P > 1 beyond the wire ({s, cpu_s, unit, source}:
    # sim/reducer.py); the 1-process run is the bare module, without it. Empty in older files: not added.
    reducer: dict[str, dict[str, Any]] = field(default_factory=dict)
    machine: str = ""
    commands: list[str] = field(default_factory=list)
    schema: str = SCHEMA

    def save(self, path: str | Path) -> None:
        """Write atomically (a crash never leaves half a file)."""
        from ..reporting import write_json

        write_json(Path(path), asdict(self))

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """Read a calibration file; anything else is one clear line."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError("--calibration", str(path), "no such file (write one with `trainscale plan calibrate`)")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError("--calibration", str(path), f"not JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ConfigError("--calibration", str(path), f"not a calibration file (schema {SCHEMA}); "
                              "write one with `trainscale plan calibrate`")
        try:
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except TypeError as e:
            raise ConfigError("--calibration", str(path), f"incomplete calibration ({e})") from None

    def check_job(self, other: dict[str, Any], path: str) -> None:
        """Refuse to forecast a job this calibration did not measure, naming the first difference."""
        for k in KEY_FIELDS:
            if k in other and other[k] != self.job.get(k):
                raise ConfigError("--calibration", path, f"measured another job ({k} = {self.job.get(k)!r}, "
                                  f"these options give {other[k]!r}); re-run `trainscale plan calibrate` with them")

    def base_job(self, threads: int) -> Job:
        """The 1-process job at ``threads`` intra-op threads (the nearest measured count)."""
        counts = sorted(int(t) for t in self.single)
        t = min(counts, key=lambda c: (abs(c - threads), -c))
        s = self.single[str(t)]
        r = self.reducer_at(t)
        return Job(str(self.job.get("model.name")), self.params, int(self.job.get("data.batch_size") or 1),
                   s["step_s"], s["compute_s"], spread=s.get("spread", 0.0), tensor_bytes=list(self.tensor_bytes),
                   buffer_bytes=self.buffer_bytes, cpu_s=s.get("cpu_s", 0.0), threads=t,
                   core_share=share_per_thread(s.get("cpu_s", 0.0), s.get("mean_step_s", s["step_s"]), t),
                   reducer_cpu_s=float(r.get("cpu_s", 0.0)))

    def reducer_at(self, threads: int) -> dict[str, Any]:
        """The reducer's time measured at ``threads`` threads, else at the nearest count measured ({}: none)."""
        if not self.reducer:
            return {}
        t = min((int(c) for c in self.reducer), key=lambda c: (abs(c - threads), -c))
        return self.reducer[str(t)]

    def measured_terms(self) -> dict[str, float]:
        """What this calibration measured of ``costs/scale.py``'s terms, from its 1-process run with the most
        threads: the compute's spread, and the host's jitter (the wall step's noise beyond the compute's)."""
        if not self.single:
            return {}
        s = self.single[str(max(int(t) for t in self.single))]
        out = {"spread": float(s.get("spread", 0.0))}
        if "host_jitter_s" in s:
            out["host_jitter_s"] = float(s["host_jitter_s"])
        return out

    def cluster(self, nproc_max: int = 1) -> ClusterSpec:
        """This machine as a cluster: all-reduce time and CPU fits, core shares and per-thread-count jobs."""
        fitted = _fits(self.allreduce)
        single = {int(t): self.base_job(int(t)) for t in self.single}
        # Other programs' runnable threads, from the 1-process run with the fewest threads: extrapolates the
        # core share to process counts the probe did not run.
        one = single[min(single)]
        # Several nodes: a node holds the most processes per node calibrated across them (replay is per world).
        per_node = max(int(p) for p in self.across) if self.across else max([nproc_max, *fitted, 1])
        return ClusterSpec(gpus_per_node=per_node, device="cpu", fitted=fitted, comm_cpu=_fits(self.allreduce, cpu=True),
                       share={int(p): float(v) for p, v in self.share.items()}, single=single, cores=self.cores,
                       replay={int(p): v for p, v in self.replay.items()},
                       outside=outside_threads(one.core_share, one.threads, self.cores),
                       across=_fits(self.across), across_cpu=_fits(self.across, cpu=True), nodes_fitted=self.nnodes,
                       across_hier=_fits(self.across_hier), across_hier_cpu=_fits(self.across_hier, cpu=True),
                       replay_hier={int(p): v for p, v in self.replay_hier.items()})
