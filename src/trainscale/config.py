"""Configuration: one documented dataclass per section, TOML in, ``--section.field value`` overrides.

Every field carries its documentation in ``metadata["doc"]``; options are typed with ``Literal`` and
checked on construction, so a bad value fails at start with one line naming the field, the value
given and what is accepted.

Example::

    cfg = load_config(["--model.name", "mlp", "--strategy.bucket_mb", "0"])
    cfg.strategy.bucket_mb  # 0.0
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from . import config_io
from .config_io import apply_overrides, config_to_dict, config_to_toml, gather_values, parse_override_args, read_toml
from .errors import ConfigError
from .schema.contract import PHASE_FLAGS, PHASES, SPANS, STEP_ROW  # the summary contract, re-exported

__all__ = [
    "ConfigError",
    "JobConfig",
    "ModelConfig",
    "DataConfig",
    "OptimConfig",
    "StrategyConfig",
    "CheckpointConfig",
    "LogConfig",
    "AblateConfig",
    "PsConfig",
    "Config",
    "load_config",
    "apply_overrides",
    "config_to_dict",
    "config_to_toml",
    "describe_fields",
    "field_options",
    "parse_override_args",
    "read_toml",
    "PHASE_FLAGS",
    "PHASES",
    "SPANS",
    "STEP_ROW",
]


def _f(default: Any, doc: str, **kw: Any) -> Any:
    """A dataclass field with its documentation attached."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"doc": doc}, **kw)
    return field(default=default, metadata={"doc": doc}, **kw)


class _Section:
    """Shared checks; each section calls them from ``__post_init__``."""

    _name = ""
    # Set by @dataclass on every section; declared here so that dataclasses.fields(self) type-checks.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def _fail(self, fld: str, accepted: str) -> None:
        raise ConfigError(f"{self._name}.{fld}", getattr(self, fld), accepted)

    def _check_literals(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            if typing.get_origin(hints[f.name]) is Literal and getattr(self, f.name) not in typing.get_args(hints[f.name]):
                self._fail(f.name, "one of " + ", ".join(map(str, typing.get_args(hints[f.name]))))

    def _at_least(self, fld: str, low: float, what: str = "") -> None:
        value = getattr(self, fld)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
            self._fail(fld, f"must be a number >= {low:g}" + (f" ({what})" if what else ""))

    def __post_init__(self) -> None:
        self._check_literals()


@dataclass
class JobConfig(_Section):
    """What the run is: length, device, process group."""

    _name = "job"
    steps: int = _f(300, "optimizer steps to run (across epochs; the loader restarts epochs as needed)")
    seed: int = _f(0, "seed for model init, data order and every rank's RNG")
    device: Literal["auto", "cpu", "cuda"] = _f("auto", "auto: cuda:LOCAL_RANK when CUDA is available, else cpu")
    backend: Literal["auto", "gloo", "nccl"] = _f("auto", "process-group backend; auto: nccl on CUDA, gloo otherwise")
    threads: int = _f(0, "intra-op threads per process; 0: this machine's cores / local processes")
    timeout_s: float = _f(300.0, "hang timeout: when no rank makes progress (a step, a checkpoint, an evaluation) "
                                 "for this long, every rank exits within job.heartbeat_s + a few seconds, naming the "
                                 "rank that stopped; PyTorch's collective timeout backs it up 3 heartbeats (>= 5 s) later")
    heartbeat_s: float = _f(1.0, "period of each rank's heartbeat through the c10d store (hang detection, "
                                 "preemption); 0: off, PyTorch's collective timeout alone (naming no rank)")
    preempt_grace_s: int = _f(30, "after SIGTERM to the launcher, seconds the ranks get to reach a step boundary and "
                                  "write the checkpoint before torchrun kills them (torchrun's --shutdown-timeout)")
    eval_every: int = _f(0, "evaluate every N steps; 0: only at the end")
    out: str = _f("", "the run's folder for artefacts (metrics.jsonl, timeline.json, profiles, tracker files); "
                   "empty: beside --json, or none")
    slow_rank: int = _f(-1, "fault injection for experiments: this rank computes slow_factor x slower; -1: none")
    slow_factor: float = _f(1.0, "fault injection: compute-time multiplier of job.slow_rank (e.g. 1.5)")
    slow_from_step: int = _f(0, "fault injection: job.slow_rank is slow from this step on (0: from the start)")
    loss: str = _f("cross_entropy", "loss of trainscale train: cross_entropy, mse, l1, or a user's "
                                    "package.module:function(output, target) returning a scalar tensor")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._at_least("steps", 1, "optimizer steps")
        self._at_least("slow_rank", -1, "-1 means no injected straggler")
        self._at_least("slow_factor", 1, "1 means no slow-down")
        self._at_least("slow_from_step", 0)
        self._at_least("threads", 0, "0 means automatic")
        self._at_least("timeout_s", 1)
        self._at_least("heartbeat_s", 0, "0 means off")
        if 0 < self.heartbeat_s and self.heartbeat_s * 2 > self.timeout_s:
            self._fail("heartbeat_s", f"must be at most half of job.timeout_s = {self.timeout_s:g} (or 0: off)")
        self._at_least("preempt_grace_s", 1)
        self._at_least("eval_every", 0)


@dataclass
class ModelConfig(_Section):
    """Which network to train; see ``trainscale.models.available()``."""

    _name = "model"
    name: str = _f("mlp", "registry name (mlp, resnet18, resnet50, se_resnext50/101/152), torchvision:NAME / "
                          "timm:NAME, or your own builder as module.path:function")
    width: int = _f(0, "base width (channels of the first stage, hidden units of mlp); 0: the model's default")
    depth: int = _f(2, "hidden layers of mlp (ignored by the other models)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.name, str) or not self.name:
            self._fail("name", "a model name, e.g. mlp or resnet18")
        self._at_least("width", 0, "0 means the model's default")
        self._at_least("depth", 1)


@dataclass
class DataConfig(_Section):
    """Where samples come from and how they are batched."""

    _name = "data"
    name: str = _f("digits", "registry name: synthetic, digits (scikit-learn's handwritten digits), "
                   "imagefolder (data.path = ROOT/CLASS/IMAGE.jpg), packed (data.path = a `trainscale data pack` folder)")
    batch_size: int = _f(32, "samples per process per micro-step")
    image_size: int = _f(32, "side of the images the model sees (synthetic, imagefolder, packed; digits are 8x8)")
    channels: int = _f(3, "channels of synthetic images")
    num_classes: int = _f(10, "classes of synthetic data")
    train_size: int = _f(2048, "samples in the synthetic training set")
    eval_size: int = _f(500, "samples in the synthetic evaluation set")
    workers: int = _f(0, "loader worker processes per rank; 0: load in the training process")
    shuffle: bool = _f(True, "reshuffle the training set every epoch (same order on every world size)")
    sample_delay_ms: float = _f(0.0, "simulated storage latency per training sample read (slow disk experiments)")
    sample_delay_scope: Literal["node", "process"] = _f(
        "node", "node: one simulated disk per machine, reads of all its processes queue; process: one per process")
    path: str = _f("", "imagefolder: the training folder; packed: the pack folder")
    eval_path: str = _f("", "imagefolder/packed: evaluation folder or pack; empty: no evaluation set")
    prefetch: int = _f(2, "batches a background thread keeps ready on the device (CUDA: copied on a side stream); "
                          "0: load in the step")
    decoder: Literal["auto", "opencv", "pillow"] = _f("auto", "image decoder; auto: opencv when installed "
                                                               "(about 2x faster here), else pillow")
    on_error: Literal["skip", "raise"] = _f("skip", "an unreadable image: skip (warn, count, leave it out) or raise")
    backend: Literal["torch", "dali"] = _f("torch", "torch: DataLoader workers + prefetcher; dali: NVIDIA DALI "
                                                    "(imagefolder on CUDA, needs nvidia-dali)")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._at_least("sample_delay_ms", 0)
        for f in ("batch_size", "image_size", "channels", "num_classes", "train_size"):
            self._at_least(f, 1)
        self._at_least("eval_size", 0)
        self._at_least("workers", 0)
        self._at_least("prefetch", 0)


@dataclass
class OptimConfig(_Section):
    """Optimizer and learning-rate schedule."""

    _name = "optim"
    name: Literal["sgd", "adamw"] = _f("sgd", "optimizer")
    lr: float = _f(0.05, "learning rate at optim.base_batch samples per step")
    momentum: float = _f(0.9, "SGD momentum")
    weight_decay: float = _f(0.0, "weight decay")
    lr_scaling: Literal["none", "linear"] = _f("none", "linear: lr x global batch / base_batch (Goyal et al. 2017)")
    base_batch: int = _f(32, "global batch at which optim.lr applies (for lr_scaling linear)")
    warmup_steps: int = _f(0, "steps of gradual warmup to the (scaled) rate")
    schedule: Literal["constant", "cosine"] = _f("constant", "decay after warmup")
    clip_grad_norm: float = _f(0.0, "clip the whole model's gradient norm to this before each optimizer step "
                               "(unscaled under fp16, as torch.nn.utils.clip_grad_norm_); 0: no clipping")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._at_least("lr", 0)
        self._at_least("clip_grad_norm", 0)
        self._at_least("momentum", 0)
        self._at_least("weight_decay", 0)
        self._at_least("base_batch", 1)
        self._at_least("warmup_steps", 0)


@dataclass
class StrategyConfig(_Section):
    """How gradients are exchanged between processes."""

    _name = "strategy"
    name: Literal["ddp"] = _f("ddp", "ddp: synchronous data parallel, one process per device")
    bucket_mb: float | Literal["auto"] = _f(
        25.0, "fused all-reduce bucket size in MB; 0: one all-reduce per gradient tensor; auto: try "
        "strategy.bucket_candidates on the first steps and keep the fastest")
    overlap: bool = _f(True, "true: all-reduce buckets as they become ready in backward; false: after backward")
    grad_accum: int = _f(1, "micro-steps per optimizer step; gradients are exchanged on the last one only")
    amp: Literal["none", "bf16", "fp16"] = _f("none", "mixed precision; fp16 adds a dynamic loss scaler")
    amp_cast_outputs: bool = _f(False, "under amp, cast the model's outputs back to float32 (a copy of each, every "
                                       "step); off: the loss runs under autocast, which computes the losses on its "
                                       "float32 list (cross_entropy, mse_loss, ...) in float32")
    broadcast_buffers: bool = _f(True, "sync BatchNorm running stats from rank 0 every forward (DDP's default)")
    hierarchical: bool = _f(False, "all-reduce in two levels: reduce-scatter inside each node, all-reduce across "
                            "nodes, all-gather inside each node")
    local_size: int = _f(0, "processes per node for hierarchical; 0: the launcher's LOCAL_WORLD_SIZE")
    compression: Literal["none", "fp16", "bf16", "powersgd"] = _f(
        "none", "gradient compression on the wire (PyTorch's DDP comm hooks)")
    powersgd_rank: int = _f(1, "rank of PowerSGD's low-rank approximation")
    powersgd_warmup: int = _f(10, "steps of plain all-reduce before PowerSGD starts (at least 2)")
    comm_groups: int = _f(1, "process groups the buckets are spread over, so their all-reduces run concurrently")
    local_sgd_period: int = _f(0, "local SGD: average parameters every H steps, no gradient exchange between; 0: off")
    local_sgd_warmup: int = _f(0, "synchronous steps before local SGD starts")
    shard_optimizer: bool = _f(False, "shard optimizer state across ranks (ZeroRedundancyOptimizer)")
    bucket_candidates: str = _f("1,4,16,64", "bucket sizes in MB that bucket_mb auto tries")
    autotune_steps: int = _f(3, "timed steps per bucket size tried by bucket_mb auto (after 2 warm-up steps)")
    pipeline_stages: int = _f(1, "pipeline parallelism: processes the model is split across (torch.distributed."
                                 "pipelining); 1: off; the world is replicas x stages, DDP inside each stage's replicas")
    microbatches: int = _f(4, "pipeline: micro-batches each process's batch (data.batch_size) is cut into; must "
                              "divide it; more micro-batches, smaller bubble")
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b", "zbv"] = _f(
        "1f1b", "pipeline schedule: gpipe (all forwards, then all backwards), 1f1b, interleaved-1f1b (several "
                "model chunks per process, strategy.stages_per_rank), zbv (zero-bubble V, 2 chunks per process)")
    stages_per_rank: int = _f(1, "pipeline: model chunks per process (interleaved-1f1b: >= 2; zbv: 2)")
    split: str = _f("auto", "where the model is cut: auto (each layer's forward+backward timed on this device with "
                            "the real micro-batch, then the split that minimises the slowest stage), uniform (layers), "
                            "params (parameter count), or the comma-separated names of the layers that start "
                            "stages 2, 3, ...")
    fsdp: bool = _f(False, "fully sharded data parallelism (FSDP2, torch.distributed.fsdp.fully_shard): parameters, "
                           "gradients and optimizer state sharded across ranks; each unit (strategy.fsdp_modules) is "
                           "all-gathered for its forward and backward and its gradients reduce-scattered")
    fsdp_modules: str = _f("", "FSDP and activation checkpointing: the model's units, comma-separated module class "
                               "names (Block) or module names (layers.0); empty: the model's own blocks (a registry "
                               "model's blocks, an nn.Sequential's layers with parameters, the entries of its "
                               "nn.ModuleLists); the root holds the rest")
    reshard_after_forward: bool = _f(True, "FSDP: free each unit's gathered parameters after its forward and gather "
                                           "them again in backward (less memory, one more all-gather per unit)")
    fsdp_param_dtype: Literal["fp32", "bf16", "fp16"] = _f(
        "fp32", "FSDP mixed precision: the dtype parameters are all-gathered and computed in (MixedPrecisionPolicy); "
                "the sharded parameters and the optimizer stay fp32")
    fsdp_reduce_dtype: Literal["fp32", "bf16", "fp16"] = _f(
        "fp32", "FSDP mixed precision: the dtype gradients are reduce-scattered in")
    fsdp_cpu_offload: bool = _f(False, "FSDP: keep sharded parameters, gradients and optimizer state in host memory "
                                       "and step the optimizer there (CPUOffloadPolicy); needs a CUDA device")
    activation_checkpointing: bool = _f(False, "recompute each unit's activations in backward instead of keeping them "
                                               "(torch.utils.checkpoint per unit of strategy.fsdp_modules), with or "
                                               "without FSDP")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bucket_mb != "auto":
            self._at_least("bucket_mb", 0, "0 means one all-reduce per gradient tensor, or auto")
        self._at_least("grad_accum", 1)
        self._at_least("local_size", 0, "0 means the launcher's LOCAL_WORLD_SIZE")
        self._at_least("powersgd_rank", 1, "the rank of the low-rank approximation")
        self._at_least("powersgd_warmup", 2, "DDP rebuilds its buckets after the first step")
        self._at_least("comm_groups", 1)
        self._at_least("local_sgd_period", 0, "0 means off")
        self._at_least("local_sgd_warmup", 0)
        self._at_least("autotune_steps", 1)
        try:
            cands = [float(c) for c in str(self.bucket_candidates).split(",")]
        except ValueError:
            cands = []
        if not cands or min(cands) < 0:
            self._fail("bucket_candidates", "comma-separated sizes in MB >= 0, e.g. 1,4,16,64")
        self._at_least("pipeline_stages", 1, "1 means no pipeline")
        self._at_least("microbatches", 1)
        self._at_least("stages_per_rank", 1)
        if not isinstance(self.split, str) or not self.split.strip():
            self._fail("split", "auto, uniform, params, or comma-separated layer names")
        if self.pipeline_stages > 1:
            self._check_pipeline()

    def _check_pipeline(self) -> None:
        """Pipelining with what it cannot be combined with (one line each, at start)."""
        if self.schedule == "zbv" and self.stages_per_rank != 2:
            self._fail("stages_per_rank", "zbv runs exactly 2 model chunks per process (its V shape); set 2")
        if self.schedule == "interleaved-1f1b" and self.stages_per_rank < 2:
            self._fail("stages_per_rank", "interleaved-1f1b needs >= 2 model chunks per process")
        if self.schedule in ("gpipe", "1f1b") and self.stages_per_rank != 1:
            self._fail("stages_per_rank", f"{self.schedule} runs one chunk per process; set 1, or use "
                                          "strategy.schedule interleaved-1f1b")
        if self.schedule != "gpipe" and self.microbatches < self.pipeline_stages:
            self._fail("microbatches", f"{self.schedule} needs at least as many micro-batches as stages "
                                       f"({self.pipeline_stages}); or use strategy.schedule gpipe")
        if self.schedule in ("interleaved-1f1b", "zbv") and self.microbatches % self.pipeline_stages:
            self._fail("microbatches", f"{self.schedule} needs a multiple of the stage count {self.pipeline_stages}")
        if self.grad_accum != 1:
            self._fail("grad_accum", "pipelining accumulates over its micro-batches itself; set 1 and raise "
                                     "strategy.microbatches")
        unsupported = {"local_sgd_period": "local SGD", "shard_optimizer": "ZeRO", "hierarchical": "hierarchical "
                       "all-reduce", "comm_groups": "several communicators"}
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for key, what in unsupported.items():
            if getattr(self, key) != defaults[key]:
                self._fail(key, f"{what} is not supported with pipelining (strategy.pipeline_stages = "
                                f"{self.pipeline_stages}); leave it at its default")
        if self.compression == "powersgd":
            self._fail("compression", "powersgd is not supported with pipelining; use none, fp16 or bf16")
        if self.bucket_mb == "auto":
            self._fail("bucket_mb", "auto is not supported with pipelining; give a size in MB")
        if self.amp == "fp16":
            self._fail("amp", "fp16's loss scaler sees the loss on the last stage only; use bf16 with pipelining")


@dataclass
class CheckpointConfig(_Section):
    """When and where checkpoints are written."""

    _name = "checkpoint"
    dir: str = _f("", "folder for checkpoints; empty: no checkpoints")
    every: int = _f(0, "write every N steps; 0: only at the end (when checkpoint.dir is set)")
    keep: int = _f(2, "how many recent step checkpoints to keep (last.pt is always kept)")
    format: Literal["file", "dcp"] = _f(
        "file", "file: one step_N.pt written by rank 0; dcp: a step_N/ folder of torch.distributed.checkpoint, "
                "each rank writes its own shard (ZeRO state stays sharded) and it loads at another world size")
    async_save: bool = _f(False, "dcp: write in a background thread after copying the state to host memory, so the "
                                 "step does not wait for the disk (the next checkpoint waits for the previous write)")
    on_error: Literal["stop", "warn"] = _f(
        "stop", "a checkpoint that cannot be written (folder unwritable or full): stop the run (exit 2) or warn and "
                "train on; the previous checkpoint stays intact either way")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._at_least("every", 0)
        if self.async_save and self.format != "dcp":
            self._fail("async_save", "needs checkpoint.format dcp (the one-file format is written by rank 0 in the step)")
        self._at_least("keep", 1)


@dataclass
class LogConfig(_Section):
    """What is shown and measured."""

    _name = "log"
    every: int = _f(20, "fetch metrics from the device every N steps, without a host sync: each log point's row is "
                        "written at the next one (the last at once)")
    skip_first: int = _f(3, "steps excluded from timing as warm-up")
    level: Literal["debug", "info", "warning"] = _f("info", "log level of rank 0 (other ranks log at debug)")
    progress: Literal["auto", "bar", "lines", "none"] = _f("auto", "auto: a progress bar on a terminal, lines otherwise")
    profile: bool = _f(False, "profile the measured steps with torch.profiler: rank 0's per-operator table and "
                       "each rank's Chrome trace (traces/trace_rankN.json) in the run's folder")
    metrics: bool = _f(True, "rank 0 appends one JSON line per log point to metrics.jsonl in the run's folder "
                       "(job.out, else beside --json), flushed: a crashed run keeps its curve")
    tracker: Literal["none", "tensorboard", "mlflow", "wandb"] = _f(
        "none", "also send the log points to: tensorboard (event files), mlflow (local file store), wandb (offline); "
        "written under log.tracker_dir")
    tracker_dir: str = _f("", "where the tracker writes; empty: the run's folder (tensorboard/, mlruns/, wandb/ in it); "
                          "mlflow also takes a tracking URI (sqlite:///mlflow.db, http://host:5000)")
    run_name: str = _f("", "the run's name in the tracker; empty: the tracker's own")
    timeline: bool = _f(False, "write timeline.json (Chrome trace / Perfetto) in the run's folder: per rank, spans for "
                        "data wait, forward+backward, waiting for the slowest rank, exposed communication, optimizer")
    timeline_steps: int = _f(50, "how many of the last measured steps the timeline keeps")
    accounting: bool = _f(True, "per-rank time accounting (Linux): each step's run-queue wait and CPU time of the "
                          "rank's threads (from /proc schedstat), its exposed communication wait and when its last "
                          "gradient was ready on a clock common to all ranks; in the summary's accounting object "
                          "and per-step rank_steps rows (benchmarks/doctor_accounting.py measures its cost)")
    stragglers: bool = _f(True, "live straggler monitor: each rank's own time (compute, data wait and, with "
                          "accounting, its wait for a CPU), compared across ranks every log.straggler_every "
                          "measured steps; a rank that became slow is named in a warning and in the summary's "
                          "stragglers list")
    straggler_every: int = _f(10, "steps per window of the straggler monitor (each rank but rank 0 writes its "
                                  "windows to the store, which rank 0 reads): shorter detects sooner and costs more")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._at_least("every", 1)
        self._at_least("skip_first", 0)
        self._at_least("timeline_steps", 1)
        self._at_least("straggler_every", 1)


@dataclass
class AblateConfig(_Section):
    """Controlled experiments for the doctor: remove one part of the step and keep the rest."""

    _name = "ablate"
    comm: bool = _f(False, "no gradient exchange: each rank steps on its own gradients")
    data: bool = _f(False, "one batch made once and kept on the device: no loading")
    compute: Literal["none", "sleep"] = _f(
        "none", "sleep: each leaf module's forward and backward replaced by a sleep of its duration measured in "
                "ablate.calibrate_steps calibration steps of the same run (the framework, collectives remain)")
    calibrate_steps: int = _f(5, "steps timed per module before compute is replaced by sleeps (not measured)")
    sleep_times: str = _f("", "sleep_times.json of an earlier sleep test: sleep those durations instead of calibrating "
                              "here, so that runs at 1 and N processes sleep alike (the original sleep test used one mean operator time)")

    phases: str = _f(
        "", "paired experiments in one run, e.g. 'base,no_data,no_comm': blocks of ablate.phase_steps steps cycle "
            "through these (no_data: one batch kept on the device; no_comm: no gradient exchange) and the summary "
            "gains per-phase timings; all phases share the run's own start-up, placement and drift")
    phase_steps: int = _f(8, "steps per block of ablate.phases; the first steps of each block, while the input "
                             "pipeline's buffers refill or drain, are not timed")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._at_least("calibrate_steps", 1)
        self._at_least("phase_steps", 2)
        names = self.phase_list()
        bad = [x for x in names if x not in PHASES]
        if bad or len(set(names)) != len(names) or (self.phases and len(names) < 2):
            self._fail("phases", f"two or more distinct names from {', '.join(PHASES)}, comma-separated")
        if names and (self.comm or self.data or self.compute != "none"):
            self._fail("phases", "sets comm and data itself, block by block: leave ablate.comm, ablate.data and "
                                 "ablate.compute at their defaults")

    def phase_list(self) -> list[str]:
        """The phases in cycle order (empty: no phases)."""
        return [x.strip() for x in self.phases.split(",") if x.strip()]


@dataclass
class PsConfig(_Section):
    """Parameter-server training on Ray (``trainscale ps``)."""

    _name = "ps"
    mode: Literal["sync", "k-sync", "k-batch-sync", "async", "k-async", "k-batch-async", "downpour"] = _f(
        "sync", "synchronisation policy (Dutta et al. 2018)")
    learners: int = _f(2, "learner actors P")
    k: Literal["auto"] | int = _f("auto", "K for the k-* modes, 1 <= K <= P; auto: P // 2")
    shards: int = _f(1, "parameter-server shards, parameters split across them balanced by size")
    lr_rule: Literal["constant", "staleness", "distance"] = _f("constant", "learning rate against staleness")
    lr: float = _f(0.05, "base learning rate of the server's optimizer")
    lr_max: float = _f(0.1, "cap of the distance rule")
    lr_c: float = _f(0.01, "C of the distance rule: lr = min(C / |w_now - w_then|^2, lr_max)")
    delay: str = _f("none", "injected straggling: none | exp:MEAN | shifted-exp:SHIFT,MEAN | slow:RANK,FACTOR")
    steps: int = _f(200, "server updates to run")
    time_s: float = _f(0.0, "stop after this many seconds instead (0: use ps.steps)")
    fetch_every: int = _f(1, "downpour: fetch parameters every N steps")
    push_every: int = _f(1, "downpour: push accumulated gradients every N steps")
    snapshot_every: int = _f(50, "server shards snapshot their state every N updates")
    threads: int = _f(1, "intra-op threads of each learner process")
    timeout_s: float = _f(60.0, "longest any wait may take before the run fails with a clear error")
    max_restarts: int = _f(3, "times Ray restarts a dead learner or shard before the run gives it up")
    snapshot_dir: str = _f("", "folder for shard snapshots (shared storage on a cluster); empty: a temporary one")
    eval_every: int = _f(0, "keep the parameters every N updates for an eval curve; 0: evaluate at the end only")
    learner_gpus: float = _f(0.0, "GPUs per learner (Ray num_gpus); > 0: learners compute on CUDA")
    learner_cpus: float = _f(0.0, "CPUs Ray reserves per learner (0: none; learners mostly wait on each other)")
    shard_cpus: float = _f(0.0, "CPUs Ray reserves per server shard")
    placement: Literal["none", "pack", "spread", "strict-spread"] = _f(
        "none", "server shards in a Ray placement group: spread (across nodes when it can), strict-spread "
                "(one node each, or the run fails at start), pack (together); none: Ray's default scheduling")

    def __post_init__(self) -> None:
        super().__post_init__()
        for f in ("learner_gpus", "learner_cpus", "shard_cpus"):
            self._at_least(f, 0)
        for f in ("learners", "shards", "fetch_every", "push_every", "snapshot_every", "threads", "steps"):
            self._at_least(f, 1)
        for f in ("time_s", "max_restarts", "eval_every"):
            self._at_least(f, 0)
        self._at_least("timeout_s", 1)
        for f in ("lr", "lr_max", "lr_c"):
            if isinstance(getattr(self, f), bool) or not getattr(self, f) > 0:
                self._fail(f, "must be a number > 0")
        if self.mode.startswith("k-") and self.k != "auto":
            if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= self.learners:
                self._fail("k", f"K must be between 1 and ps.learners = {self.learners} for mode {self.mode}")
        elif self.k != "auto" and (isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1):
            self._fail("k", "K must be >= 1 (or auto)")
        elif self.mode.startswith("k-") and self.learners < 2:
            self._fail("k", f"auto gives K = P // 2 = 0 with ps.learners = {self.learners}; give K >= 1")
        if self.mode == "downpour" and self.lr_rule == "distance":
            self._fail("lr_rule", "downpour takes constant or staleness (its shards never compute a global distance)")


@dataclass
class Config:
    """The whole configuration of a run, one attribute per section."""

    job: JobConfig = field(default_factory=JobConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    ablate: AblateConfig = field(default_factory=AblateConfig)
    ps: PsConfig = field(default_factory=PsConfig)

    def __post_init__(self) -> None:
        """Checks across sections (a pipeline's micro-batches against the batch, experiments it cannot run)."""
        s = self.strategy
        a = self.ablate
        if s.fsdp and (a.comm or "no_comm" in a.phases or a.compute != "none"):
            # FSDP's parameters are all-gathered in forward: there is no step without communication to compare with.
            raise ConfigError("strategy.fsdp", True, "the ablate.comm, ablate.phases no_comm and ablate.compute "
                              "experiments do not run under FSDP (its forward all-gathers the parameters: no step "
                              "runs without communication); trainscale doctor measures FSDP's exposed "
                              "communication per step instead")
        if s.pipeline_stages <= 1:
            return
        if self.data.batch_size % s.microbatches:
            raise ConfigError("strategy.microbatches", s.microbatches, f"must divide data.batch_size = "
                              f"{self.data.batch_size} (each process's batch is cut into equal micro-batches)")
        if a.comm or a.phases or a.compute != "none":
            raise ConfigError("strategy.pipeline_stages", s.pipeline_stages, "the ablate.comm, ablate.phases and "
                              "ablate.compute experiments do not run on pipelines; leave them off")


# ----------------------------------------------------------------------------------------- loading
# The machinery lives in ``config_io``; these bind it to ``Config``.


def load_config(argv: list[str] | None = None, config_file: str | None = None,
                extra: dict[str, Any] | None = None) -> Config:
    """Defaults, then the TOML file, then ``--section.field value`` arguments, then ``extra``."""
    return apply_overrides(Config(), gather_values(argv, config_file, extra))


def field_options(sections: tuple[str, ...] | None = None) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """Per section: (name, its docstring, [(--section.field, help text)]) for grouped ``--help`` pages."""
    return config_io.field_options(Config(), sections)


def describe_fields(sections: tuple[str, ...] | None = None) -> str:
    """One line per field: ``--section.field (type, default): doc``; used by ``--help``."""
    return config_io.describe_fields(Config(), sections)
