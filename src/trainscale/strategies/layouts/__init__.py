"""One object per parallel layout behind one protocol: the bare module, DDP, FSDP2, pipeline stages.

``apply_strategy`` picks the layout once; ``Strategy`` delegates every layout-dependent operation to it and
never asks which layout it holds (Lightning's ``SingleDeviceStrategy`` / ``DDPStrategy`` / ``FSDPStrategy``
split, torchtitan's "DDP only when there is a replica to exchange with"). ``Bare`` is the model as the user
wrote it, nothing exchanged; each other layout is ``Bare`` plus what it exchanges, overriding only that.
"""

from __future__ import annotations

from .bare import Bare
from .ops import clip_norm, exchange_after_backward
from .protocol import Layout

__all__ = ["Layout", "Bare", "clip_norm", "exchange_after_backward"]
