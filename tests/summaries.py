"""Every run summary the suite writes is checked against the shipped JSON Schema, with a strict parser; every
doctor result it writes is checked against the doctor's accounting rules (``trainscale.lab.invariants``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

try:
    import jsonschema
except ImportError:  # pragma: no cover - `make test` installs it (the test extra)
    jsonschema = None


def _no_constant(name: str) -> Any:
    raise ValueError(f"not strict JSON: {name}")


def is_run_summary(doc: Any) -> bool:
    """A run summary (not a bench/doctor report or a ps summary): it carries these keys."""
    return isinstance(doc, dict) and {"schema_version", "world_size", "loss_curve"} <= doc.keys()


def check_summary_file(path: Path) -> dict[str, Any] | None:
    """Parse ``path`` strictly (no NaN/Infinity); when it is a run summary, validate it. Returns it, or None."""
    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except ValueError:
        return None  # not JSON at all (a half-written file is the test's own concern)
    if not is_run_summary(doc):
        return None
    doc = json.loads(text, parse_constant=_no_constant)
    if jsonschema is not None:
        from trainscale.train.summary import summary_schema
        jsonschema.validate(doc, summary_schema(), format_checker=jsonschema.FormatChecker())
    return doc


def check_doctor_file(path: Path) -> None:
    """A doctor result (``doctor.json`` with ``result``) must keep the accounting rules; anything else passes."""
    try:
        doc = json.loads(Path(path).read_text())
    except ValueError:
        return
    if isinstance(doc, dict) and doc.get("result") and doc.get("kind") != "pipeline":
        from trainscale.lab.invariants import violations
        bad = violations(doc)
        assert not bad, f"{path}: the doctor's accounting rules are broken: {bad}"
        assert doc.get("decomposition"), f"{path}: no decomposition of the scaling loss"
        report = Path(path).with_name("doctor.md")
        if report.is_file():
            bad_shares = printed_shares_out_of_range(report.read_text())
            assert not bad_shares, f"{report}: shares printed outside 0-100%: {bad_shares}"


def printed_shares_out_of_range(md: str) -> list[str]:
    """Every share of the scaling loss a doctor report prints (its causes table's share column, "N% of the
    scaling loss", the composition line's "(N%)") that is above 100% or below 0."""
    found = re.findall(r"(-?\d+)% of the scaling loss", md)
    found += [x for line in md.splitlines() if line.startswith("The scaling loss, ")
              for x in re.findall(r"\((-?\d+)%\)", line)]
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| # | cause | ms/step | share of loss |"):
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                found += re.findall(r"^(-?\d+)%$", row.split("|")[4].strip())
    return [f"{x}%" for x in found if not 0 <= int(x) <= 100]


def check_tree(folder: Path) -> int:
    """Check every ``*.json`` under ``folder``; returns how many run summaries were validated."""
    for p in Path(folder).rglob("doctor.json"):
        check_doctor_file(p)
    return sum(check_summary_file(p) is not None for p in Path(folder).rglob("*.json") if p.is_file())
