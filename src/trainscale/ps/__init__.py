"""Parameter-server training on Ray (``trainscale ps``).

The synchronisation policies (:mod:`.policies`), delay specs, learning-rate rules, sharding and the
order-statistics predictions are plain Python and import neither Ray nor torch's distributed stack;
:func:`run_ps` (in :mod:`.job`) needs a running Ray.
"""

from ..costs.order_stats import order_statistic_exp, predicted_update_time, sync_async_ratio
from .delays import Delay, parse_delay
from .lr_rules import coefficients
from .policies import COORDINATED_MODES, MODES, Apply, Cancel, Launch, Policy, resolve_k
from .sharding import Layout, balance

__all__ = ["Delay", "parse_delay", "coefficients", "COORDINATED_MODES", "MODES", "Apply", "Cancel", "Launch",
           "Policy", "resolve_k", "Layout", "balance", "order_statistic_exp", "predicted_update_time",
           "sync_async_ratio", "run_ps"]


def __getattr__(name: str):
    # run_ps pulls in Ray; import it only when asked so the pure parts stay light.
    if name == "run_ps":
        from .job import run_ps
        return run_ps
    raise AttributeError(name)
