"""The run API's error: it was used in a way that cannot work."""

__all__ = ["RunError"]


class RunError(ValueError):
    """The run API was used in a way it cannot work (one line that says what to change)."""
