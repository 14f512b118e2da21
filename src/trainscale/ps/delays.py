"""Straggler injection: a seeded delay added to each learner's mini-batch (``ps.delay``).

Specs (seconds)::

    none                    no added delay
    exp:MEAN                an exponential delay with mean MEAN (the model of Dutta et al.'s runtime theorem, AISTATS 2018)
    shifted-exp:SHIFT,MEAN  SHIFT plus an exponential delay with mean MEAN
    slow:RANK,FACTOR        learner RANK takes FACTOR times its measured compute time; the others none

Example::

    d = parse_delay("exp:0.2")
    d.sample(np.random.default_rng(0), learner=1, compute_s=0.001)   # 0.13...
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ConfigError

__all__ = ["Delay", "parse_delay", "delay_rng"]

ACCEPTED = "expected none, exp:MEAN, shifted-exp:SHIFT,MEAN or slow:RANK,FACTOR (seconds, MEAN > 0, FACTOR >= 1)"


@dataclass(frozen=True)
class Delay:
    """A parsed delay spec; ``kind`` is none, exp, shifted-exp or slow."""

    kind: str = "none"
    mean: float = 0.0
    shift: float = 0.0
    rank: int = -1
    factor: float = 1.0

    def sample(self, rng: np.random.Generator, learner: int, compute_s: float) -> float:
        """Seconds to add to one mini-batch of ``learner`` whose compute took ``compute_s``."""
        if self.kind in ("exp", "shifted-exp"):
            return self.shift + float(rng.exponential(self.mean))
        if self.kind == "slow" and learner == self.rank:
            return (self.factor - 1.0) * compute_s
        return 0.0

    def expected(self) -> float:
        """Mean added delay of an ordinary learner (0 for none and slow)."""
        return self.shift + self.mean if self.kind in ("exp", "shifted-exp") else 0.0


def parse_delay(spec: str, learners: int | None = None) -> Delay:
    """Parse ``ps.delay``; a spec that does not parse raises ConfigError with one line."""
    text = str(spec).strip().lower()
    if text in ("", "none", "0"):
        return Delay()
    kind, sep, args = text.partition(":")
    try:
        values = [float(a) for a in args.split(",")] if sep else []
    except ValueError:
        raise ConfigError("ps.delay", spec, ACCEPTED) from None
    if kind == "exp" and len(values) == 1 and values[0] > 0:
        return Delay("exp", mean=values[0])
    if kind == "shifted-exp" and len(values) == 2 and values[0] >= 0 and values[1] > 0:
        return Delay("shifted-exp", shift=values[0], mean=values[1])
    if kind == "slow" and len(values) == 2 and values[0] == int(values[0]) and values[0] >= 0 and values[1] >= 1:
        if learners is not None and values[0] >= learners:
            raise ConfigError("ps.delay", spec, f"RANK must name a learner, 0 to {learners - 1}")
        return Delay("slow", rank=int(values[0]), factor=values[1])
    raise ConfigError("ps.delay", spec, ACCEPTED)


def delay_rng(seed: int, learner: int, incarnation: int = 0) -> np.random.Generator:
    """The delay stream of one learner: fixed by the job seed, distinct per learner and restart."""
    return np.random.default_rng([seed, learner, incarnation, 0x5EED])
