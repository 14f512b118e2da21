"""The run API's error (it was used in a way that cannot work), and how a user's script reports it: one line."""

from __future__ import annotations

import os
import sys
from types import TracebackType

__all__ = ["RunError", "report_bad_input_in_one_line"]


class RunError(ValueError):
    """The run API was used in a way it cannot work (one line that says what to change)."""


def report_bad_input_in_one_line() -> None:
    """Make a ``RunError`` or ``ConfigError`` that ends a user's script one line, not a traceback per rank.

    The first rank prints ``trainscale: <what was wrong>``; any other exception keeps Python's traceback. Under
    torchrun every rank records what ended it in torchrun's error file, so that ``trainscale launch`` names the
    rank and its error, and can tell the rank that failed from a peer that only lost its connection to it.
    """
    from ..config import ConfigError

    previous = sys.excepthook
    if getattr(previous, "trainscale", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(value, (RunError, ConfigError)):
            previous(kind, value, tb)
        elif os.environ.get("RANK", "0") == "0":
            print(f"trainscale: {value}", file=sys.stderr, flush=True)
        if os.environ.get("TORCHELASTIC_ERROR_FILE"):
            _record_for_torchrun(value, tb)

    hook.trainscale = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _record_for_torchrun(value: BaseException, tb: TracebackType | None) -> None:
    """Write ``value`` to torchrun's error file, with its traceback (torchrun's ``record`` does it for a function)
    and, in a distributed job, the rank's newest collective and place in the code (``trainscale`` in the
    message's ``extraInfo``): the launcher compares them across the failed ranks."""
    import json

    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    from ..distributed.hangs import at_failure

    try:  # record_exception formats the exception being handled: an excepthook has none, so raise it once more
        raise value.with_traceback(tb)
    except BaseException:
        ErrorHandler().record_exception(value)
    try:
        where = at_failure(tb)
        if where is not None:
            path = os.environ["TORCHELASTIC_ERROR_FILE"]
            with open(path) as f:
                data = json.load(f)
            data["message"]["extraInfo"]["trainscale"] = where
            with open(path, "w") as f:
                json.dump(data, f)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # the error itself is recorded: the launcher names the rank without its collective
