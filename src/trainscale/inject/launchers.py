"""A script that starts its own processes, or fixes its own process count: met in each rank as it happens.

trainscale launches every rank itself (torchrun, 1 and N processes), so a script's own launch is either taken
over or refused with the reason:
- Lightning's ``Trainer``/``Fabric`` given ``devices=2`` (or ``"auto"``) under torchrun read the launcher's
  environment and spawn nothing, but check ``devices`` against torchrun's process count and stop at the 1-process
  baseline. The patch hands them torchrun's count instead (``devices`` is per node: the per-process work is the
  script's own), and the run records what the script asked.
- ``torch.multiprocessing.spawn``/``start_processes`` (a script's own ``mp.spawn``, Lightning's ``ddp_spawn``)
  would start ranks trainscale neither launched nor instruments: the run stops there and says so in one line.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

__all__ = ["refuse_spawn", "lightning_devices", "LIGHTNING_CONNECTORS", "SPAWNS"]

SPAWNS = ("the script starts its own processes ({how}, nprocs={n}): trainscale launches each rank itself (torchrun at "
          "1 and N processes) and cannot time ranks a script spawns; run it as torchrun does -- read RANK, "
          "LOCAL_RANK and WORLD_SIZE from the environment, call dist.init_process_group() without a rank, call "
          "your worker once instead of spawning it (Lightning: strategy=\"ddp\", not \"ddp_spawn\")")
# Where Lightning reads ``devices`` (module, class), for the Trainer and for Fabric, both package names.
LIGHTNING_CONNECTORS = (("lightning.pytorch.trainer.connectors.accelerator_connector", "_AcceleratorConnector"),
                        ("pytorch_lightning.trainer.connectors.accelerator_connector", "_AcceleratorConnector"),
                        ("lightning.fabric.connector", "_Connector"),
                        ("lightning_fabric.connector", "_Connector"))


def refuse_spawn(torch: Any, agent: Any) -> str:
    """``torch.multiprocessing``'s spawn entry points stop the run with ``SPAWNS`` (nothing is spawned)."""
    mp = torch.multiprocessing
    inner = sys.modules.get("torch.multiprocessing.spawn")
    if not hasattr(mp, "start_processes") or inner is None:
        return "not measured: no torch.multiprocessing.start_processes in this PyTorch"
    for name in ("spawn", "start_processes"):
        original = getattr(mp, name, None)
        if original is None:
            continue

        @functools.wraps(original)
        def refuse(fn: Any, args: tuple = (), nprocs: int = 1, *rest: Any, _name: str = name, **kwargs: Any) -> Any:
            agent.refuse(SPAWNS.format(how=f"torch.multiprocessing.{_name}", n=nprocs))

        setattr(mp, name, refuse)
        if getattr(inner, name, None) is original:
            setattr(inner, name, refuse)
    return "measured"


def lightning_devices(module: Any, cls_name: str, agent: Any) -> None:
    """Lightning's connector ``cls_name`` in ``module`` gets torchrun's process count as ``devices``."""
    cls = getattr(module, cls_name)
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        want = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        given = kwargs.get("devices", "auto")
        if _count(given) != want:
            kwargs["devices"] = given[:want] if isinstance(given, list) and len(given) >= want else want
            agent.status["devices"] = (f"set by trainscale: the script's devices={given!r} ran as "
                                       f"devices={kwargs['devices']!r}, {want} process(es) per node as launched")
        init(self, *args, **kwargs)

    cls.__init__ = __init__


def _count(devices: Any) -> int | None:
    """How many processes per node ``devices`` asks for (None: "auto", -1, or a form Lightning resolves later)."""
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return devices if devices > 0 else None
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str):
        text = devices.strip().rstrip(",")
        if text.isdigit():
            return int(text) or None
        if "," in text:
            return len([d for d in text.split(",") if d.strip()])
    return None
