"""The ``nvidia-smi topo -m`` reader on seed 000's matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainscale.config import ConfigError
from trainscale.costs.topology import parse_topo

SEED000 = (Path(__file__).parent / "seed000_topo.txt").read_text()


def test_seed000_round_trip():
    topo = parse_topo(SEED000)
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert topo.matrix[0][1] == "PIX" and topo.matrix[0][4] == "PXB" and topo.matrix[3][3] == "X"
    assert topo.nics == {"mlx5_0": ["SOC"] * 8}
    assert topo.affinity == ["0-13"] * 8
    again = parse_topo(topo.render())
    assert again == topo


def test_seed000_ring_and_groups():
    topo = parse_topo(SEED000)
    assert topo.ring_bottleneck() == "PXB"
    assert topo.ring_bottleneck([0, 1, 2, 3]) == "PIX"
    assert topo.groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert topo.nic_class() == "SOC"


def test_nvlink_cells():
    text = "\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tNV2\t X \n"
    topo = parse_topo(text)
    assert topo.ring_bottleneck() == "NV2"


@pytest.mark.parametrize("text", ["hello world", "\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tFOO\t X \n",
                                  "\tGPU0\tGPU1\nGPU0\t X \tPIX\n"])
def test_bad_topology_is_one_clear_error(text):
    with pytest.raises(ConfigError) as e:
        parse_topo(text, "topo.txt")
    msg = str(e.value)
    assert "--topo" in msg and "topo.txt" in msg and "PIX" in msg and "\n" not in msg
