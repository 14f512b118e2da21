"""Backend choice: NCCL only when every local process has a GPU of its own (it refuses shared GPUs)."""

import pytest
import torch

from trainscale.config import ConfigError
from trainscale.distributed.env import resolve_backend

GPU = torch.device("cuda", 0)


def test_auto_picks_nccl_with_a_gpu_per_process_and_gloo_when_processes_share_one():
    assert resolve_backend("auto", GPU, local_processes=1, gpus=1) == "nccl"
    assert resolve_backend("auto", GPU, local_processes=8, gpus=8) == "nccl"
    assert resolve_backend("auto", GPU, local_processes=2, gpus=1) == "gloo"
    assert resolve_backend("auto", torch.device("cpu"), local_processes=2) == "gloo"


def test_nccl_on_shared_gpus_is_one_clear_error():
    with pytest.raises(ConfigError, match="nccl needs one GPU per process .2 processes on this machine, 1 GPU"):
        resolve_backend("nccl", GPU, local_processes=2, gpus=1)
    with pytest.raises(ConfigError, match="nccl needs CUDA devices"):
        resolve_backend("nccl", torch.device("cpu"))
