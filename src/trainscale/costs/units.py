"""Numbers as users write them: counts (``25.6e6``, ``25_600_000``, ``25.6M``), link rates (``50gbe``,
``50gbps``, ``12.5GB/s``, optionally ``@5us``) and GPU specs (``bf16=989T,mem=3.35TB/s``).

Counts take k, M, G (or B, billions: ``8.03B``) and T. In rates, bits and bytes follow the SI/IEC symbols: a
lower-case ``b`` is a bit (``Gb/s``, ``gbps``, ``gbe``), an upper-case ``B`` a byte (``GB/s``, ``GBps``).
Prefixes are decimal (k, M, G, T, P), as network and memory datasheets quote them. Every malformed value is a ConfigError naming the option, the value and what is accepted.

Example::

    parse_count("25.6M", "--params")          # 25600000
    parse_rate("50gbe", "--inter")            # (6.25e9 bytes/s, None)
    parse_rate("12.5GB/s@5us", "--inter")     # (12.5e9, 5e-06)
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from ..errors import ConfigError

__all__ = ["parse_count", "parse_number", "parse_rate", "parse_latency", "parse_gpu_spec", "COUNT_HELP",
           "RATE_HELP", "GPU_SPEC_HELP", "PRECISIONS"]

PREFIX = {"": 1.0, "B": 1e9, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6, "g": 1e9, "G": 1e9, "t": 1e12, "T": 1e12,
          "p": 1e15, "P": 1e15}
COUNT_HELP = "a number such as 25600000, 25_600_000, 25.6e6 or 25.6M (suffixes k, M, G or B, T)"
RATE_HELP = ("a link rate such as 50gbe, 50gbps, 50Gb/s or 12.5GB/s (b: bits, B: bytes), optionally with a "
             "per-hop latency: 50gbps@5us")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
GPU_SPEC_HELP = ("a GPU spec of key=value pairs: a peak per precision (" + ", ".join(PRECISIONS) +
                 ") or flops= for all, in FLOP/s (e.g. 989T or 989e12), and mem= memory bandwidth (e.g. 3.35TB/s); "
                 "name= optional, e.g. name=H200,bf16=989T,fp8=1979T,mem=4.8TB/s")

_NUM = r"(?P<num>[-+]?(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_COUNT = re.compile(_NUM + r"\s*(?P<pre>[kKmMgGBtTpP]?)$")
_RATE = re.compile(_NUM + r"\s*(?P<pre>[kKmMgGtT]?)(?P<unit>gbe|GbE|GBE|b/s|B/s|bps|Bps|bit/s|byte/s)$")
_LATENCY = re.compile(_NUM + r"\s*(?P<unit>ns|us|µs|ms|s)$")
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def _exact(text: str | float | int, key: str, accepted: str) -> Decimal:
    """The exact decimal value of ``text`` (so that ``8.03B`` is 8,030,000,000, not 8,029,999,999.999999)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = Decimal(repr(text))
    else:
        m = _COUNT.match(str(text).strip())
        if not m or "__" in m["num"]:
            raise ConfigError(key, text, accepted)
        value = Decimal(m["num"].replace("_", "")) * Decimal(repr(PREFIX[m["pre"]]))
    if not value.is_finite() or not math.isfinite(float(value)):
        raise ConfigError(key, text, accepted)
    return value


def parse_number(text: str | float | int, key: str, accepted: str = COUNT_HELP) -> float:
    """A finite number with an optional decimal suffix (``25.6M``); anything else is a ConfigError."""
    return float(_exact(text, key, accepted))


def parse_count(text: str | int, key: str, minimum: int = 1) -> int:
    """A whole count >= ``minimum`` written in any numeric form (``25.6e6``, ``25_600_000``, ``25.6M``)."""
    value = _exact(text, key, COUNT_HELP)
    if value != value.to_integral_value() or value < minimum:
        raise ConfigError(key, text, f"must be a whole number >= {minimum}; {COUNT_HELP}")
    return int(value)


def parse_latency(text: str, key: str, whole: str | None = None) -> float:
    """Seconds from ``5us``, ``0.5ms``, ``800ns`` or ``2e-6s``; negative or unit-less is a ConfigError.

    ``whole``: the value the user gave (``50gbps@5us``), named in the error instead of its latency part.
    """
    shown = text if whole is None else whole
    m = _LATENCY.match(text.strip())
    if not m:
        raise ConfigError(key, shown, "a latency after @ with its unit, e.g. 5us, 0.5ms, 800ns")
    value = float(m["num"].replace("_", "")) * _SECONDS[m["unit"]]
    if value < 0 or not math.isfinite(value):
        raise ConfigError(key, shown, "a latency must be >= 0, e.g. 5us")
    return value


def parse_rate(text: str, key: str) -> tuple[float, float | None]:
    """(bytes per second, per-hop latency in seconds or None) of ``RATE[@LATENCY]``."""
    rate_text, _, lat_text = str(text).strip().partition("@")
    m = _RATE.match(rate_text.strip())
    if not m:
        raise ConfigError(key, text, RATE_HELP)
    unit = m["unit"]
    bits = unit.lower() == "gbe" or unit in ("b/s", "bps", "bit/s")
    value = float(m["num"].replace("_", "")) * (1e9 if unit.lower() == "gbe" else PREFIX[m["pre"]])
    if unit.lower() == "gbe" and m["pre"]:
        raise ConfigError(key, text, RATE_HELP)
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(key, text, "a link rate must be > 0; " + RATE_HELP)
    latency = parse_latency(lat_text, key, str(text)) if lat_text else None
    return (value / 8 if bits else value), latency


def _spec_value(name: str, raw: str, key: str, whole: str) -> float:
    """One GPU spec field: FLOP/s (``989T``, ``989e12``, ``989tflops``) or, for ``mem``, bytes/s."""
    if name == "mem":
        try:
            rate, lat = parse_rate(raw, key)
        except ConfigError:
            raise ConfigError(key, whole, "mem= is a memory bandwidth > 0 with its unit, e.g. 3.35TB/s or 900GB/s") \
                from None
        if lat is not None:
            raise ConfigError(key, whole, "mem= takes no latency")
        return rate
    flops = re.sub(r"(?i)flop(s|/s)?$", "", raw.strip())
    try:
        value = parse_number(flops, key)
    except ConfigError:
        value = -1.0
    if value <= 0:
        raise ConfigError(key, whole, f"{name}= is a peak > 0 in FLOP/s, e.g. 989T or 989e12")
    return value


def parse_gpu_spec(text: str, key: str = "--gpu") -> tuple[str, dict[str, float], float]:
    """(name, peak FLOP/s per precision, memory bytes/s) of ``name=X,bf16=989T,mem=3.35TB/s``."""
    fields: dict[str, str] = {}
    for part in str(text).split(","):
        name, eq, raw = part.partition("=")
        name = name.strip().lower()
        if not eq or not raw.strip() or name not in ("name", "mem", "flops", *PRECISIONS):
            raise ConfigError(key, text, GPU_SPEC_HELP)
        if name in fields:
            raise ConfigError(key, text, f"{name}= given twice; " + GPU_SPEC_HELP)
        fields[name] = raw.strip()
    if "mem" not in fields:
        raise ConfigError(key, text, "GPU spec lacks mem= (memory bandwidth, e.g. mem=3.35TB/s); " + GPU_SPEC_HELP)
    peaks = {p: _spec_value(p, fields[p], key, text) for p in PRECISIONS if p in fields}
    if "flops" in fields:
        every = _spec_value("flops", fields["flops"], key, text)
        peaks = {p: peaks.get(p, every) for p in PRECISIONS}
    if not peaks:
        raise ConfigError(key, text, "GPU spec lacks a peak (flops= or one of " + ", ".join(f"{p}=" for p in PRECISIONS)
                          + "); " + GPU_SPEC_HELP)
    return fields.get("name", "custom GPU"), peaks, _spec_value("mem", fields["mem"], key, text)
