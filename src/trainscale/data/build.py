"""Build the training loader a configuration asks for, with its start-up checks."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

from ..config import ConfigError, DataConfig
from ..log import logger
from .checks import startup_warnings
from .datasets import DataInfo
from .loader import TrainLoader

__all__ = ["build_train_loader", "check_data"]


def build_train_loader(cfg: DataConfig, dataset: Dataset, info: DataInfo, device: torch.device, rank: int,
                       world: int, seed: int, is_main: bool = True) -> Any:
    """``TrainLoader`` (backend torch) or ``DaliLoader`` (backend dali); rank 0 logs the start-up checks."""
    if cfg.backend == "dali":
        from .dali import DaliLoader
        return DaliLoader(cfg, info, device, rank, world, seed)
    if is_main:
        for msg in startup_warnings(dataset, info.in_shape, cfg.batch_size, cfg.workers, cfg.prefetch):
            logger.warning(msg)
    return TrainLoader(dataset, info, device, cfg.batch_size, rank, world, cfg.workers, cfg.shuffle, seed,
                       prefetch=cfg.prefetch, on_error=cfg.on_error)


def check_data(cfg: DataConfig) -> None:
    """Checks made once before any rank starts: the folder or pack can be read (raises ConfigError)."""
    if cfg.name in ("imagefolder", "packed") and not cfg.path:
        raise ConfigError("data.path", cfg.path, f"data.name = {cfg.name} needs a folder: --data.path DIR")
    if cfg.name == "imagefolder":
        from .imagefolder import scan_folder
        scan_folder(cfg.path, "data.path")
        if cfg.eval_path:
            scan_folder(cfg.eval_path, "data.eval_path")
    elif cfg.name == "packed":
        from .packed import Pack
        Pack(cfg.path, "data.path")
        if cfg.eval_path:
            Pack(cfg.eval_path, "data.eval_path")
    if cfg.backend == "dali":
        from .dali import check_dali
        check_dali(cfg)
    if cfg.decoder != "auto":
        from .decode import resolve_decoder
        resolve_decoder(cfg.decoder)
