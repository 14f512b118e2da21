"""``log.tracker``: the live metrics sent to TensorBoard, MLflow or Weights & Biases.

Each tracker's package is imported only when it is chosen, and each writes locally with no network:
TensorBoard event files, an MLflow file store, W&B in offline mode (``wandb sync`` uploads later).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Protocol

from ...config import ConfigError

__all__ = ["Tracker", "open_tracker", "check_tracker", "TRACKER_PACKAGES"]

# tracker -> (module to import, the pip extra that installs it)
TRACKER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow"),
                    "wandb": ("wandb", "wandb")}


class Tracker(Protocol):
    def log(self, step: int, values: dict[str, float]) -> None: ...
    def close(self) -> None: ...


def check_tracker(name: str) -> None:
    """Fail with one line when the chosen tracker's package is not installed."""
    if name in TRACKER_PACKAGES and importlib.util.find_spec(TRACKER_PACKAGES[name][0]) is None:
        raise ConfigError("log.tracker", name, f"needs the {TRACKER_PACKAGES[name][0]} package: "
                          f"pip install 'trainscale[{TRACKER_PACKAGES[name][1]}]'")


class _TensorBoard:
    def __init__(self, folder: Path, config: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=str(folder))
        self.writer.add_text("config", "```\n" + _flat_text(config) + "\n```", 0)

    def log(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()  # a crashed run keeps its points

    def close(self) -> None:
        self.writer.close()


class _MLflow:
    def __init__(self, uri: str, config: dict[str, Any], run_name: str):
        # MLflow 3 keeps its file store in maintenance mode behind this switch; it is still the one store that
        # needs no database and no server (a sqlite:// or http:// log.tracker_dir is used as given).
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name("trainscale")
        exp_id = exp.experiment_id if exp else self.client.create_experiment("trainscale")
        self.run_id = self.client.create_run(exp_id, run_name=run_name or None).info.run_id
        for k, v in _flat(config).items():
            self.client.log_param(self.run_id, k, v)

    def log(self, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric
        ms = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, ms, step) for k, v in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class _Wandb:
    def __init__(self, folder: Path, config: dict[str, Any], run_name: str):
        import wandb
        os.environ.setdefault("WANDB_MODE", "offline")  # no network unless the user asks for it
        self.run = wandb.init(project="trainscale", dir=str(folder), config=config, name=run_name or None)

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def open_tracker(name: str, folder: Path | str, config: dict[str, Any], run_name: str = "") -> Tracker | None:
    """The chosen tracker writing under ``folder`` (tensorboard/, mlruns/ or wandb/ there); None for none.

    For mlflow, ``folder`` may also be a tracking URI (``sqlite:///mlflow.db``, ``http://host:5000``).
    """
    if name == "none":
        return None
    check_tracker(name)
    if name == "mlflow" and ("://" in str(folder) or str(folder).startswith("sqlite:")):
        return _MLflow(str(folder), config, run_name)
    folder = Path(folder)
    if name == "tensorboard":
        return _TensorBoard(folder / "tensorboard", config)
    if name == "mlflow":
        (folder / "mlruns").mkdir(parents=True, exist_ok=True)
        return _MLflow((folder / "mlruns").resolve().as_uri(), config, run_name)
    folder.mkdir(parents=True, exist_ok=True)
    return _Wandb(folder, config, run_name)


def _flat(config: dict[str, Any]) -> dict[str, str]:
    return {f"{s}.{k}": str(v) for s, body in config.items() for k, v in body.items()}


def _flat_text(config: dict[str, Any]) -> str:
    return "\n".join(f"{k} = {v}" for k, v in _flat(config).items())
