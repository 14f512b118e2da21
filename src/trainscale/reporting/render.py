"""Reports: one list of blocks rendered twice, as Markdown (PNG files beside it) and as one
self-contained HTML file (the same PNGs embedded); plots drawn with matplotlib."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["Block", "render_markdown", "render_html", "write_reports", "figure", "save", "legend_below",
           "numeric_columns"]

# ("h2", text) | ("p", text) | ("table", headers, rows) | ("img", filename, caption) | ("pre", text)
Block = tuple


def figure(width: float = 6.0, height: float = 3.6, rows: int = 1, cols: int = 1, **share: Any) -> tuple[Any, Any]:
    """A matplotlib figure on the file-only Agg backend (no display needed): one axes, or a flat list of
    ``rows * cols`` panels (``share``: ``sharex``/``sharey`` as for ``plt.subplots``)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=(width, height), dpi=110, squeeze=False, **share)
    panels = list(axes.flat)
    for ax in panels:
        ax.grid(alpha=0.3)
    return fig, panels[0] if len(panels) == 1 else panels


def legend_below(fig: Any, ax: Any, ncol: int = 2) -> None:
    """The legend under the axes and their label, where it hides no bar (``save`` keeps it in the PNG)."""
    from matplotlib.transforms import offset_copy

    ax.legend(fontsize=7, ncol=ncol, loc="upper center", bbox_to_anchor=(0.5, 0),
              bbox_transform=offset_copy(ax.transAxes, fig=fig, y=-34, units="points"))


def save(fig: Any, path: Path, legend_below: float = 0.0) -> Path:
    """Write a figure as PNG and free it; ``legend_below``: the fraction of the height kept free at the bottom
    for a figure legend."""
    import matplotlib.pyplot as plt

    fig.tight_layout(rect=(0, legend_below, 1, 1))
    fig.savefig(path, bbox_inches="tight")  # a legend placed outside the axes is kept, not cut off
    plt.close(fig)
    return path


# A cell that reads as a number (or a list or range of numbers): "+3.2", "1,234", "42%", "1.02x", "+1.0 .. +2.5", "-".
_NUMBER = re.compile(r"^[-+]?[\d,.]+(e[-+]?\d+)?\s*(%|x|ms|s)?$|^-$")


def numeric_columns(rows: Sequence[Sequence[Any]]) -> list[bool]:
    """Per column: True when every cell is a number (right-aligned); text columns are left-aligned."""
    width = max((len(r) for r in rows), default=0)

    def number(c: Any) -> bool:
        parts = [x for x in re.split(r"\s*(?:\.\.|,\s)\s*", str(c).strip()) if x]
        return bool(parts) and all(_NUMBER.match(x) for x in parts)
    return [bool(rows) and all(number(r[i]) for r in rows if i < len(r)) for i in range(width)]


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    right = numeric_columns(rows) + [False] * len(headers)
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("--:" if right[i] else ":--" for i in range(len(headers)))
           + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


def render_markdown(title: str, blocks: list[Block]) -> str:
    """Markdown with images as relative links to the PNG files."""
    out = [f"# {title}", ""]
    for b in blocks:
        kind = b[0]
        if kind == "h2":
            out += [f"## {b[1]}", ""]
        elif kind == "p":
            out += [b[1], ""]
        elif kind == "table":
            out += [_md_table(b[1], b[2]), ""]
        elif kind == "img":
            out += [f"![{b[2]}]({b[1]})", ""]
        elif kind == "pre":
            out += ["```", b[1], "```", ""]
    return "\n".join(out)


def render_html(title: str, blocks: list[Block], folder: Path) -> str:
    """One HTML file that needs nothing else: the PNGs are embedded as data URIs."""
    esc = html.escape
    body = [f"<h1>{esc(title)}</h1>"]
    for b in blocks:
        kind = b[0]
        if kind == "h2":
            body.append(f"<h2>{esc(b[1])}</h2>")
        elif kind == "p":
            body.append(f"<p>{esc(b[1])}</p>")
        elif kind == "table":
            right = numeric_columns(b[2]) + [False] * len(b[1])
            cls = lambda i, right=right: ' class="num"' if right[i] else ""
            head = "".join(f"<th{cls(i)}>{esc(str(h))}</th>" for i, h in enumerate(b[1]))
            rows = "".join("<tr>" + "".join(f"<td{cls(i)}>{esc(str(c))}</td>" for i, c in enumerate(r)) + "</tr>"
                           for r in b[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "img":
            data = base64.b64encode((folder / b[1]).read_bytes()).decode()
            # An id per figure (the file's stem), so that report.html#ranks links to, or opens at, one plot.
            body.append(f'<figure id="{esc(Path(b[1]).stem)}">'
                        f'<img alt="{esc(b[2])}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{esc(b[2])}</figcaption></figure>")
        elif kind == "pre":
            body.append(f"<pre>{esc(b[1])}</pre>")
    # The first paragraph is the verdict: it stands out. Commands wrap instead of hiding behind a scroll bar.
    style = ("body{font-family:system-ui,sans-serif;max-width:80em;margin:2em auto;padding:0 1em;color:#222}"
             "h1+p{font-weight:600;font-size:1.1em}"
             "table{border-collapse:collapse;margin:1em 0;font-size:.92em}td,th{border:1px solid #ccc;"
             "padding:.3em .6em;text-align:left;vertical-align:top}th{background:#f3f3f3}"
             ".num{text-align:right}td.num{white-space:nowrap}"
             "img{max-width:100%}figcaption{color:#555;font-size:.9em}pre{background:#f6f6f6;padding:.8em;"
             "white-space:pre-wrap;overflow-wrap:anywhere}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def write_reports(folder: Path, stem: str, title: str, blocks: list[Block]) -> tuple[Path, Path]:
    """Write ``stem.md`` and ``stem.html`` into ``folder``."""
    md, page = folder / f"{stem}.md", folder / f"{stem}.html"
    md.write_text(render_markdown(title, blocks))
    page.write_text(render_html(title, blocks, folder))
    return md, page
