"""The hardware catalogue (``catalog.json`` beside this file): GPUs, links, NCCL constants, model sizes.

Example::

    gpu("V100").peak("fp32")   # 15.7e12 FLOP/s
    link("25gbe").bytes_per_s  # 3.125e9
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..config import ConfigError

__all__ = ["Gpu", "Link", "catalog", "gpu", "link", "known_model", "gpu_names", "link_names"]

CATALOG = Path(__file__).with_name("catalog.json")


@dataclass(frozen=True)
class Gpu:
    """One accelerator of the catalogue."""

    name: str
    tflops: dict[str, float | None]  # dense peak per precision (fp32, tf32, fp16, bf16), TFLOP/s
    mem_gbs: float                   # memory bandwidth, GB/s
    source: str

    def peak(self, precision: str = "fp32") -> float:
        """Peak FLOP/s at ``precision``; an unsupported one is a ConfigError naming those supported."""
        v = self.tflops.get(precision)
        if not v:
            ok = ", ".join(k for k, x in self.tflops.items() if x)
            raise ConfigError("--precision", precision, f"{self.name} has no {precision} peak; one of {ok}")
        return float(v) * 1e12


@dataclass(frozen=True)
class Link:
    """One link class: bandwidth per direction and NCCL's per-hop latency."""

    name: str
    gbs: float         # GB/s per direction
    hw_lat_us: float   # per-hop latency (NCCL hwLat, Ring/Simple)
    kind: str          # nvlink, pci or net
    source: str

    @property
    def bytes_per_s(self) -> float:
        return self.gbs * 1e9

    @property
    def hop_s(self) -> float:
        return self.hw_lat_us * 1e-6

    def scaled(self, factor: float, name: str | None = None) -> Link:
        """The same link at ``factor`` of its bandwidth (a slower path through bridges, several links bonded)."""
        return Link(name or self.name, self.gbs * factor, self.hw_lat_us, self.kind, self.source)


@lru_cache(maxsize=1)
def catalog() -> dict[str, Any]:
    """The catalogue as read from ``catalog.json``."""
    return json.loads(CATALOG.read_text())


def gpu_names() -> list[str]:
    return list(catalog()["gpus"])


def link_names() -> list[str]:
    return list(catalog()["links"])


def gpu(name: str, key: str = "--gpu") -> Gpu:
    """The GPU called ``name`` (case-insensitive); an unknown one is one line naming those known."""
    table = catalog()["gpus"]
    match = {k.lower(): k for k in table}.get(str(name).lower())
    if match is None:
        raise ConfigError(key, name, "unknown GPU; one of " + ", ".join(table))
    e = table[match]
    return Gpu(match, {p: e.get(p) for p in ("fp32", "tf32", "fp16", "bf16")}, float(e["mem_gbs"]), e["source"])


def link(name: str, key: str = "--intra") -> Link:
    """The link class called ``name``; an unknown one is one line naming those known."""
    table = catalog()["links"]
    match = {k.lower(): k for k in table}.get(str(name).lower())
    if match is None:
        raise ConfigError(key, name, "unknown link; one of " + ", ".join(table))
    e = table[match]
    return Link(match, float(e["gbs"]), float(e["hw_lat_us"]), e["class"], e["source"])


def known_model(name: str) -> dict[str, Any] | None:
    """Catalogue entry (params, tail share) of a published model, or None."""
    return catalog()["models"].get(name)
