"""The bench's sweep plan, as pure decisions (the runner in ``bench.py`` only executes them).

The sweep measures each world size in ascending order, ``repeat`` runs each, and stops at the first failed run
(the points measured before it are kept). Weak scaling keeps the user's per-device batch; strong scaling keeps
the global batch of the base point, so every world size must divide it.

Example::

    plan = BenchPlan(nprocs=(1, 2, 4), repeat=3, scaling="strong", batch_size=64)
    plan.run_args(["--model", "mlp"], 4)   # [..., "--data.batch_size", "16", "--timeline"]
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ConfigError

__all__ = ["BenchPlan"]


@dataclass(frozen=True)
class BenchPlan:
    """Process counts per node to sweep, runs per point, weak or strong scaling; checked when built."""

    nprocs: tuple[int, ...]
    repeat: int
    scaling: str = "weak"
    nnodes: int = 1
    batch_size: int = 0  # the user's per-device batch, kept at the base point

    def __post_init__(self) -> None:
        if self.scaling == "strong":
            bad = [n for n in self.nprocs if self.global_batch % self.world(n)]
            if bad:
                raise ConfigError("--batch-size", self.batch_size,
                                  f"strong scaling keeps the global batch {self.global_batch}; it must divide by "
                                  f"every world size (not by {self.world(bad[0])})")

    @property
    def global_batch(self) -> int:
        """Samples per step at the base point, which strong scaling keeps at every world size."""
        return self.batch_size * self.world(self.nprocs[0])

    @property
    def total_runs(self) -> int:
        """Runs the whole sweep takes when none fails."""
        return len(self.nprocs) * self.repeat

    def world(self, nproc: int) -> int:
        """World size of a point with ``nproc`` processes on each node."""
        return nproc * self.nnodes

    def run_args(self, user: list[str], nproc: int) -> list[str]:
        """The train options of a run at ``nproc`` per node: the user's, the strong-scaling batch, a timeline."""
        batch = [] if self.scaling == "weak" else [
            "--data.batch_size", str(self.global_batch // self.world(nproc))]
        # --timeline costs two clock reads a step; its trace is the report's timeline picture.
        return [*user, *batch, "--timeline"]
