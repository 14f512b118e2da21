"""Reports: one list of blocks rendered twice, as Markdown (PNG files beside it) and as one
self-contained HTML file (the same PNGs embedded); plots drawn with matplotlib."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any, Sequence

__all__ = ["Block", "render_markdown", "render_html", "write_reports", "figure"]

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


def save(fig: Any, path: Path, legend_below: float = 0.0) -> Path:
    """Write a figure as PNG and free it; ``legend_below``: the fraction of the height kept free at the bottom
    for a figure legend."""
    import matplotlib.pyplot as plt

    fig.tight_layout(rect=(0, legend_below, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
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
            head = "".join(f"<th>{esc(str(h))}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in r) + "</tr>" for r in b[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "img":
            data = base64.b64encode((folder / b[1]).read_bytes()).decode()
            body.append(f'<figure><img alt="{esc(b[2])}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{esc(b[2])}</figcaption></figure>")
        elif kind == "pre":
            body.append(f"<pre>{esc(b[1])}</pre>")
    style = ("body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;"
             "text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}"
             "img{max-width:100%}figcaption{color:#555;font-size:.9em}pre{background:#f6f6f6;padding:.8em;"
             "overflow-x:auto}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def write_reports(folder: Path, stem: str, title: str, blocks: list[Block]) -> tuple[Path, Path]:
    """Write ``stem.md`` and ``stem.html`` into ``folder``."""
    md, page = folder / f"{stem}.md", folder / f"{stem}.html"
    md.write_text(render_markdown(title, blocks))
    page.write_text(render_html(title, blocks, folder))
    return md, page
