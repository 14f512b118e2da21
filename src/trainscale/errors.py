"""The error every layer raises for a value a user gave that cannot be used (a base module: imports nothing)."""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration value that cannot be used; its message is one line meant for the user."""

    def __init__(self, key: str, value: Any, accepted: str):
        self.key, self.value, self.accepted = key, value, accepted
        super().__init__(f"{key} = {value!r}: {accepted}")
