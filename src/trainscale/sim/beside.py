"""The forecast beside a measured bench: ``trainscale bench --calibration FILE`` adds it to each point.

Example::

    forecast_steps("cal.json", ["--model", "mlp"], [1, 2, 4])   # {1: 0.0031, 2: 0.0062, 4: 0.0121}
"""

from __future__ import annotations

from ..costs.forecast import StrategySpec, forecast
from .calibration import Calibration, job_key

__all__ = ["forecast_steps"]


def forecast_steps(path: str, train_args: list[str], worlds: list[int]) -> dict[int, float]:
    """Forecast median step time per world size of the calibrated job (refuses another job's calibration)."""
    from ..config import config_to_dict
    from ..jobs import check_train_args

    cfg = check_train_args(train_args)
    cal = Calibration.load(path)
    cal.check_job(job_key(config_to_dict(cfg)), path)
    bucket = cfg.strategy.bucket_mb if cfg.strategy.bucket_mb != "auto" else 25.0
    strategy = StrategySpec(bucket_mb=float(bucket), overlap=cfg.strategy.overlap)
    points = forecast(cal.base_job(cal.cores), cal.cluster(max(worlds)), strategy, worlds)
    return {p.world_size: p.step_time_s for p in points}
