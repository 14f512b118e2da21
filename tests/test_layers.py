"""DESIGN's layer table, enforced: every import inside the package (module level and inside functions) goes down.

A layer may import the layers its row names and the base modules (``about``, ``errors``, ``config_io``, ``log``,
``signals``, the package's ``__version__``); anything else is a leak that a reader of the table would not expect.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "trainscale"
BASE = {"about", "errors", "config_io", "log", "signals", "__version__"}

# layer -> what it may import (a layer name, or one module of a layer: "sim.collectives").
ALLOWED: dict[str, set[str]] = {
    "about": set(), "errors": set(), "config_io": set(), "log": set(), "signals": set(),
    # The run summary's contract: its schema, the names code addresses in it (phases, spans, step-row columns), reader.
    "schema": {"reporting"},  # the writer's atomic file
    "config": {"schema"},  # ablate.phases is checked against the contract's phases
    "train_options": {"config"},  # the options of `trainscale train`, below jobs, which checks a job's with them
    "reporting": set(),
    "distributed": {"config"},
    "models": {"config"},
    "data": {"config", "distributed", "models"},  # models: import_callable for `module:function` datasets
    # The pure cost models: every bytes/time formula, the hardware catalogue, forecasts (no torch, no jobs).
    "costs": set(),
    # The strategies' meters and the pipeline's bubble use the pure cost formulas.
    "strategies": {"config", "distributed", "costs"},
    # The run's MFU reads the GPU catalogue (one table of peaks, shared).
    "train": {"config", "schema", "train_options", "distributed", "models", "data", "strategies", "reporting", "costs"},
    "jobs": {"config", "schema", "train_options", "distributed", "reporting", "inject"},
    # An unmodified script instrumented from outside: feeds train's instruments, writes the run summary; its
    # FSDP bytes are counted by the one formula the run API's FSDP uses (costs).
    "inject": {"config", "schema", "distributed", "reporting", "train.instruments", "costs"},
    # models/data: a job's layout for calibration; nodes: calibrate across nodes as bench and doctor do;
    # strategies/distributed: the reducer's measurement wraps the job's model in the job's own DDP.
    "sim": {"config", "costs", "jobs", "nodes", "reporting", "models", "data", "strategies", "distributed"},
    "ps": {"config", "models", "data", "costs", "reporting", "jobs"},
    # The lab on several nodes: node 0 announces each run through jobs' launch hook; the others follow.
    "nodes": {"config", "distributed", "jobs", "reporting"},
    "lab": {"config", "schema", "jobs", "nodes", "reporting", "costs", "sim"},
    "ray": {"config", "train.run"},  # Ray Train's launcher of the run API: TRAINSCALE_ARGS is the run's channel
    "cli": {"*"},
    "__init__": {"config", "train"},
    "__main__": {"cli"},
}


def imports_of(path: Path, root: Path = PKG) -> list[tuple[int, str]]:
    """(line, dotted target inside trainscale) of every trainscale import in the file, at any depth."""
    rel = path.relative_to(root).with_suffix("").parts
    here = list(rel[:-1])  # the file's package, as a list of names below trainscale
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                names = [node.module] if node.module else [a.name for a in node.names]
                out += [(node.lineno, ".".join([*base, n])) for n in names]
            elif node.module and node.module.split(".")[0] == "trainscale":
                out.append((node.lineno, node.module.partition(".")[2] or "__init__"))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name.partition(".")[2]) for a in node.names if a.name.startswith("trainscale.")]
    return out


def allowed(layer: str, target: str) -> bool:
    """Whether ``layer`` may import ``target`` (a dotted module below trainscale)."""
    top = target.split(".")[0]
    rules = ALLOWED[layer]
    return (top == layer or top in BASE or "*" in rules or top in rules
            or any(target == r or target.startswith(r + ".") for r in rules))


def violations(root: Path = PKG) -> list[str]:
    """Every import that goes against the table, as ``file:line: layer -> target``."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        layer = path.relative_to(root).with_suffix("").parts[0]
        assert layer in ALLOWED, f"{path}: layer {layer!r} is not in the table: add its row"
        bad += [f"{path.relative_to(root)}:{line}: {layer} -> {target}"
                for line, target in imports_of(path, root) if not allowed(layer, target)]
    return bad


def test_every_import_follows_the_layer_table():
    assert violations() == []


@pytest.mark.parametrize("line", ["from ..lab.report import figure", "    from ..lab import doctor"])
def test_a_lab_import_in_costs_is_caught(tmp_path, line):
    # The same tree with one leak added: the check must name it.
    import shutil
    copy = tmp_path / "trainscale"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "costs" / "forecast.py"
    body = f"def _leak():\n    {line.strip()}\n" if line.startswith(" ") else line + "\n"
    target.write_text(target.read_text() + "\n" + body)
    found = violations(copy)
    assert len(found) == 1 and found[0].startswith("costs/forecast.py:") and "costs -> lab" in found[0]
