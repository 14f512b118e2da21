"""Markdown tables, matplotlib line plots and the report files of the ps experiments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

__all__ = ["md_table", "line_plot", "write_report"]


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def line_plot(path: Path, xlabel: str, ylabel: str, series: dict[str, tuple[list, list]],
              dashed: dict[str, tuple[list, list]] | None = None, logx: bool = False, logy: bool = False,
              title: str = "") -> None:
    """One PNG with a line per series (markers), and dashed lines for ``dashed`` (predictions)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; set before pyplot is imported
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {}
    for name, (xs, ys) in series.items():
        (line,) = ax.plot(xs, ys, marker="o", ms=3, label=name)
        colors[name] = line.get_color()
    for name, (xs, ys) in (dashed or {}).items():
        base = name.split(" (")[0]
        ax.plot(xs, ys, linestyle="--", color=colors.get(base), alpha=0.7, label=name)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, name: str, title: str, sections: Sequence[str], data: dict[str, Any]) -> str:
    """Write ``out/name.md`` (title + sections) and ``out/name.json`` (the data); return the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    md = f"# {title}\n\n" + "\n\n".join(sections) + "\n"
    (out / f"{name}.md").write_text(md)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    return md
