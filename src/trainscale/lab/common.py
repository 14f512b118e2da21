"""What bench and doctor share: the process-count option, the machine line of a report, the core count."""

from __future__ import annotations

from ..about import available_cores as cores
from ..config_io import int_list

__all__ = ["parse_nproc_list", "machine_description", "cores"]


def machine_description() -> str:
    """Host, cores and GPUs, for the reports' header."""
    import platform
    try:
        import torch
        gpus = torch.cuda.device_count()
        dev = f"{gpus} x {torch.cuda.get_device_name(0)}" if gpus else "no GPU"
    except Exception:  # pragma: no cover - a broken CUDA install must not stop a report
        dev = "unknown accelerator"
    return f"{platform.node()}, {cores()} CPU cores, {dev}"


def parse_nproc_list(text: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]; anything else is one clear error."""
    return int_list(text, "--nproc", "comma-separated process counts >= 1, e.g. 1,2,4")
