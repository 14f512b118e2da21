"""Numbers as users write them: counts, link rates with a latency, GPUs given by their datasheet."""

from __future__ import annotations

import pytest

from trainscale.config import ConfigError
from trainscale.costs.hardware import gpu, link
from trainscale.costs.units import parse_count, parse_gpu_spec, parse_rate


@pytest.mark.parametrize("text", ["25600000", "25_600_000", "25.6e6", "25.6M", "25600k", "0.0256G", " 25.6M "])
def test_a_count_in_any_numeric_form(text):
    assert parse_count(text, "--params") == 25_600_000
    assert parse_count("8.03B", "--params") == 8_030_000_000  # B: billions, as model cards write them


@pytest.mark.parametrize("text,why", [("25.6Q", "a number such as"), ("2.5", "whole number >= 1"),
                                      ("0", "whole number >= 1"), ("-3", "whole number >= 1"), ("1e400", "a number"),
                                      ("", "a number such as"), ("25__600", "a number such as"), ("nan", "a number")])
def test_a_bad_count_names_option_value_and_forms(text, why):
    with pytest.raises(ConfigError, match=r"--params = .*" + why):
        parse_count(text, "--params")


@pytest.mark.parametrize("text,bytes_per_s,latency", [
    ("50gbe", 6.25e9, None), ("50GbE", 6.25e9, None), ("50gbps", 6.25e9, None), ("50Gb/s", 6.25e9, None),
    ("400Gbit/s", 50e9, None), ("12.5GB/s", 12.5e9, None), ("12.5GBps", 12.5e9, None), ("3.35TB/s", 3.35e12, None),
    ("50gbps@5us", 6.25e9, 5e-6), ("12.5GB/s@0.5ms", 12.5e9, 5e-4), ("100Gb/s@800ns", 12.5e9, 8e-7),
])
def test_rates_bits_and_bytes_with_an_optional_latency(text, bytes_per_s, latency):
    rate, lat = parse_rate(text, "--inter")
    assert rate == pytest.approx(bytes_per_s)
    assert lat == (pytest.approx(latency) if latency is not None else None)


def test_a_link_by_rate_beside_the_catalogue():
    # the catalogue's 25gbe and the same rate given as a rate are the same link
    assert link("25gbe", "--inter").bytes_per_s == link("25gbps", "--inter").bytes_per_s == 3.125e9
    inter = link("50gbe", "--inter")
    assert inter.bytes_per_s == 6.25e9 and inter.hw_lat_us == 14.0 and inter.kind == "net"  # NCCL NET hop
    assert link("64GB/s", "--intra").hw_lat_us == 5.7  # NCCL PCI hop for a node's link given by rate
    assert link("50gbps@20us", "--inter").hop_s == pytest.approx(20e-6)


@pytest.mark.parametrize("text,why", [
    ("50furlongs", "unknown link; one of pcie3.*or a link rate such as 50gbe"),
    ("5g", "unknown link; one of"),
    ("-50gbps", "a link rate must be > 0"), ("0GB/s", "a link rate must be > 0"),
    ("50gbps@-3us", "'50gbps@-3us': a latency must be >= 0"), ("50gbps@3", "a latency after @ with its unit"),
])
def test_a_bad_link_is_one_line(text, why):
    with pytest.raises(ConfigError, match="--inter = .*" + why):
        link(text, "--inter")


def test_a_gpu_by_its_datasheet():
    g = gpu("name=H200,bf16=989T,fp8=1979T,mem=4.8TB/s")
    assert g.name == "H200" and g.peak("bf16") == pytest.approx(989e12) and g.peak("fp8") == pytest.approx(1979e12)
    assert g.mem_gbs == pytest.approx(4800)
    with pytest.raises(ConfigError, match="H200 has no fp32 peak; one of bf16, fp8"):
        g.peak("fp32")
    every = gpu("flops=100e12,mem=1TB/s")
    assert every.peak("fp32") == every.peak("bf16") == pytest.approx(100e12)
    assert gpu("v100").peak("fp32") == pytest.approx(15.7e12)  # names still work, in any case


@pytest.mark.parametrize("text,why", [
    ("bf16=989T", "lacks mem="), ("mem=2TB/s", "lacks a peak"), ("bf16=989T,mem=fast", "mem= is a memory bandwidth"),
    ("bf16=-1T,mem=2TB/s", "bf16= is a peak > 0"), ("bf16=989T,mem=2TB/s,color=red", "a GPU spec of key=value"),
    ("bf16=989T,bf16=1T,mem=2TB/s", "bf16= given twice"),
])
def test_a_gpu_spec_missing_or_bad_field(text, why):
    with pytest.raises(ConfigError, match=f"--gpu = '{text}': .*{why}"):
        parse_gpu_spec(text)


def test_measured_scale_terms_replace_the_catalogue_and_say_so():
    from trainscale.costs.forecast import ClusterSpec, Job, StrategySpec, forecast
    from trainscale.sim.terms import with_scale_terms

    job = Job("j", params=25_000_000, batch_size=32, step_s=0.2, compute_s=0.2)
    points = forecast(job, ClusterSpec.from_catalog("A100", 8, "nvlink3", "ib-hdr"), StrategySpec(), [1, 8, 64])
    rows: dict = {}
    quiet = with_scale_terms(points, job, "fitted", True, "A100", 0, rows, {"spread": 0.0, "host_jitter_s": 0.0})
    assert rows["spread"]["source"].startswith("measured") and rows["reducer_passes"]["source"].startswith("assumed")
    noisy = with_scale_terms(points, job, "fitted", True, "A100", 0, {}, {"spread": 0.1, "host_jitter_s": 0.01})
    assert noisy[0].efficiency == quiet[0].efficiency == points[0].efficiency  # one device waits for nobody
    assert noisy[2].efficiency < noisy[1].efficiency < quiet[1].efficiency  # more ranks, a later slowest one
