"""The consoles the commands print to: 120 columns when piped, so tables do not wrap in logs."""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["console", "err_console"]

# Piped output (CI logs, subprocess capture) gets 120 columns instead of rich's 80, so tables do not wrap.
console = Console(width=None if sys.stdout.isatty() else 120)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)

