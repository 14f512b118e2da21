"""The house's size limits, held: a reader finds one job per module, one screen per function, a folder at a glance.

ARCHITECTURE.md's limits: no module in ``src/`` over 500 lines (``config.py``, whose documented sections are the
options' reference, at most 560), no function over 60 lines, no folder with more than 24 modules.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "trainscale"
MODULE_LINES, CONFIG_LINES, FUNCTION_LINES, FOLDER_MODULES = 500, 560, 60, 24


def _modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_no_module_is_longer_than_its_limit():
    """Every module under 500 lines; config.py under 560."""
    long = {str(p.relative_to(PKG)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > (CONFIG_LINES if p.name == "config.py" else MODULE_LINES)}
    assert not long, long


def test_no_function_is_longer_than_a_screen():
    """Every function and method at most 60 lines from its `def`, docstring included."""
    long = [f"{p.relative_to(PKG)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for p in _modules() for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (node.end_lineno or node.lineno) - node.lineno + 1 > FUNCTION_LINES]
    assert not long, long


def test_no_folder_holds_more_than_24_modules():
    """A folder with more modules is split by concern (as lab/advice/ was)."""
    full = {str(d.relative_to(PKG)) or ".": n for d, n in Counter(p.parent for p in _modules()).items()
            if n > FOLDER_MODULES}
    assert not full, full
