"""The distributed-environment table printed once per job (as PaddlePaddle's launcher does)."""

from __future__ import annotations

import sys

__all__ = ["print_env_table"]


def print_env_table(rows: list[dict], *, world: str, nodes: str, master: str, backend: str,
                    source: str | None = None) -> None:
    """Print world size, nodes, master endpoint, backend, where they came from, and one line per rank on stderr."""
    from rich.console import Console  # here: every rank imports this module, rank 0 prints
    from rich.table import Table

    console = Console(file=sys.stderr, width=120)
    console.print(f"[bold]Distributed environment[/]  world size {world} | nodes {nodes} | master {master} | "
                  f"backend {backend}", highlight=False)
    if source:
        console.print(f"cluster: {source}", highlight=False, markup=False)
    table = Table()
    # stage and replica: a pipeline's layout (rank r runs stage r % S of replica r // S)
    cols = ("rank", "local_rank", "node", "device", "threads", *(k for k in ("stage", "replica") if rows and k in rows[0]))
    for col in cols:
        table.add_column(col.replace("_", " "), justify="right")
    extra = [k for k in ("host", "pid") if rows and k in rows[0]]
    for col in extra:
        table.add_column(col)
    for r in rows:
        table.add_row(*(str(r[c]) for c in (*cols, *extra)))
    console.print(table)
