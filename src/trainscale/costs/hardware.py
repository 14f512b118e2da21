"""The hardware catalogue (``catalog.json`` beside this file): GPUs, links, NCCL constants, model sizes.

Example::

    gpu("V100").peak("fp32")   # 15.7e12 FLOP/s
    link("25gbe").bytes_per_s  # 3.125e9
    link("50gbe").bytes_per_s  # 6.25e9: a rate the catalogue does not name (sim/units.py)
    gpu("name=H200,bf16=989T,mem=4.8TB/s").peak("bf16")
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["Gpu", "Link", "catalog", "gpu", "link", "known_model", "gpu_names", "link_names", "gpu_from_spec",
           "link_from_rate"]

CATALOG = Path(__file__).with_name("catalog.json")


@dataclass(frozen=True)
class Gpu:
    """One accelerator of the catalogue."""

    name: str
    tflops: dict[str, float | None]  # dense peak per precision (fp32, tf32, fp16, bf16, fp8), TFLOP/s
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
    if match is None and "=" in str(name):
        return gpu_from_spec(str(name), key)
    if match is None:
        from .units import GPU_SPEC_HELP

        raise ConfigError(key, name, "unknown GPU; one of " + ", ".join(table) + "; or " + GPU_SPEC_HELP)
    e = table[match]
    return Gpu(match, {p: e.get(p) for p in ("fp32", "tf32", "fp16", "bf16", "fp8")}, float(e["mem_gbs"]),
               e["source"])


def link(name: str, key: str = "--intra") -> Link:
    """The link class called ``name``; an unknown one is one line naming those known."""
    table = catalog()["links"]
    match = {k.lower(): k for k in table}.get(str(name).lower())
    if match is None:
        return link_from_rate(str(name), key)
    e = table[match]
    return Link(match, float(e["gbs"]), float(e["hw_lat_us"]), e["class"], e["source"])


def known_model(name: str) -> dict[str, Any] | None:
    """Catalogue entry (params, tail share) of a published model, or None."""
    return catalog()["models"].get(name)


# NCCL's per-hop latency (tuning.cc hwLat, Ring/Simple) for a link given only by its rate.
RATE_LATENCY_US = {"--inter": 14.0, "--intra": 5.7}


def link_from_rate(text: str, key: str = "--intra") -> Link:
    """A link given by its rate (``50gbe``, ``12.5GB/s@5us``); neither a rate nor a catalogue name is one line."""
    from .units import RATE_HELP, parse_rate

    try:
        rate, latency = parse_rate(text, key)
    except ConfigError as e:
        if e.accepted != RATE_HELP:  # a rate, but a bad one (negative, a bad latency): say exactly that
            raise
        raise ConfigError(key, text, "unknown link; one of " + ", ".join(catalog()["links"]) + "; or " + RATE_HELP) \
            from None
    hop_us = latency * 1e6 if latency is not None else RATE_LATENCY_US.get(key, 14.0)
    kind = "net" if key == "--inter" else "pci"
    return Link(text, rate / 1e9, hop_us, kind, f"given as {text} ({rate / 1e9:g} GB/s, {hop_us:g} us per hop)")


def gpu_from_spec(text: str, key: str = "--gpu") -> Gpu:
    """A GPU outside the catalogue, from its peaks and memory bandwidth (sim/units.py ``parse_gpu_spec``)."""
    from .units import parse_gpu_spec

    name, peaks, mem = parse_gpu_spec(text, key)
    return Gpu(name, {p: v / 1e12 for p, v in peaks.items()}, mem / 1e9, f"given as {text}")
