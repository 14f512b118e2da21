"""Reading a run summary against its schema: the numbers the schema marks as measured come back as NaN where null."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["read_summary", "summary_schema"]


@lru_cache(maxsize=1)
def summary_schema() -> dict[str, Any]:
    """The JSON Schema of the run summary, shipped in the package (``summary.schema.json``)."""
    return json.loads(resources.files(__package__).joinpath("summary.schema.json").read_text())


def read_summary(path: str | Path) -> dict[str, Any]:
    """Read a summary; the numbers the schema marks as measured (``num``) come back as NaN where null."""
    data = json.loads(Path(path).read_text())
    return _restore_nan(data, summary_schema(), summary_schema()["$defs"])


def _restore_nan(value: Any, schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    ref = schema.get("$ref", "")
    if ref == "#/$defs/num":
        return float("nan") if value is None else value
    if ref:
        schema = defs[ref.rsplit("/", 1)[1]]
    if isinstance(value, dict):
        props, rest = schema.get("properties", {}), schema.get("additionalProperties")
        return {k: _restore_nan(v, props.get(k, rest if isinstance(rest, dict) else {}), defs) for k, v in value.items()}
    if isinstance(value, list):
        prefix, items = schema.get("prefixItems", []), schema.get("items")
        return [_restore_nan(v, prefix[i] if i < len(prefix) else items if isinstance(items, dict) else {}, defs)
                for i, v in enumerate(value)]
    return value
