"""Reader of ``nvidia-smi topo -m``: the connection class of each GPU pair, the slowest hop of a ring,
and the groups for hierarchical all-reduce.

Example::

    topo = parse_topo(Path("topo.txt").read_text())
    topo.ring_bottleneck()   # 'PXB' on an 8 x P40 server
    topo.groups()            # [[0, 1, 2, 3], [4, 5, 6, 7]]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import ConfigError

__all__ = ["Topology", "parse_topo", "RANK", "CLASSES"]

# Fastest first. NV# is ranked by its link count separately (more links = faster).
RANK = {"NV": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5, "SOC": 5}
CLASSES = "X, PIX, PXB, PHB, NODE, SYS, SOC, NV#"
_CELL = re.compile(r"^(X|PIX|PXB|PHB|NODE|SYS|SOC|NV\d+)$")


@dataclass
class Topology:
    """GPU-to-GPU connection classes of one node, as ``nvidia-smi topo -m`` prints them."""

    gpus: list[str]                                  # row names, e.g. GPU0 .. GPU7
    matrix: list[list[str]]                          # matrix[i][j], "X" on the diagonal
    nics: dict[str, list[str]] = field(default_factory=dict)  # NIC name -> class to each GPU
    affinity: list[str] = field(default_factory=list)         # CPU affinity column, if printed

    def cost(self, cls: str) -> tuple[int, int]:
        """Sort key of a class: lower is faster (NV4 beats NV2 beats PIX)."""
        if cls.startswith("NV"):
            return (0, -int(cls[2:]))
        return (RANK[cls], 0)

    def ring_order(self) -> list[int]:
        """GPUs in index order: NCCL's rings follow the PCI order when no NVLink changes it."""
        return list(range(len(self.gpus)))

    def ring_bottleneck(self, members: list[int] | None = None) -> str:
        """The slowest hop of the ring through ``members`` (default: all GPUs) in index order."""
        order = members if members is not None else self.ring_order()
        if len(order) < 2:
            return "X"
        hops = [self.matrix[a][b] for a, b in zip(order, order[1:] + order[:1])]
        return max(hops, key=self.cost)

    def groups(self) -> list[list[int]]:
        """GPUs that reach each other through the fastest class present (the intra groups of hierarchical)."""
        n = len(self.gpus)
        best = min((self.matrix[i][j] for i in range(n) for j in range(n) if i != j), key=self.cost, default="X")
        seen: set[int] = set()
        out = []
        for i in range(n):
            if i in seen:
                continue
            g = [i] + [j for j in range(n) if j != i and self.cost(self.matrix[i][j]) <= self.cost(best)]
            seen.update(g)
            out.append(sorted(g))
        return out

    def nic_class(self) -> str | None:
        """The slowest class between any GPU and the first NIC (how far gradients travel to leave the node)."""
        if not self.nics:
            return None
        return max(next(iter(self.nics.values())), key=self.cost)

    def render(self) -> str:
        """The matrix in ``nvidia-smi topo -m``'s layout (parse_topo(render()) gives the same Topology)."""
        heads = self.gpus + list(self.nics)
        lines = ["\t" + "\t".join(heads) + ("\tCPU Affinity" if self.affinity else "")]
        for i, g in enumerate(self.gpus):
            cells = [f" {c} " if c == "X" else c for c in self.matrix[i]] + [self.nics[k][i] for k in self.nics]
            lines.append(g + "\t" + "\t".join(cells) + (f"\t{self.affinity[i]}" if self.affinity else ""))
        for k, row in self.nics.items():
            lines.append(k + "\t" + "\t".join(row) + "\t X ")
        return "\n".join(lines) + "\n"


def _fail(why: str, value: str) -> ConfigError:
    return ConfigError("--topo", value, f"{why}; expected `nvidia-smi topo -m` output: a header of GPU names "
                                        f"and one row per GPU with cells {CLASSES}")


def parse_topo(text: str, source: str = "topology") -> Topology:
    """Parse ``nvidia-smi topo -m`` text; anything else is a ConfigError naming what was expected."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    # The header names columns (GPU0 GPU1 ... NICs); a row starts with a name followed by cells.
    header_at = next((i for i, ln in enumerate(lines) if "GPU0" in ln.split()
                      and not any(_CELL.match(t) for t in ln.split()[1:2])), None)
    if header_at is None:
        raise _fail("no header line naming GPU0", source)
    heads = [h for h in re.split(r"\s{1,}|\t", lines[header_at].strip()) if h]
    heads = [h for h in heads if h not in ("CPU", "Affinity", "NUMA", "GPU NUMA ID")]
    gpu_cols = [h for h in heads if re.fullmatch(r"GPU\d+", h)]
    nic_cols = [h for h in heads if h not in gpu_cols and not h.startswith("Affinity")]
    rows: dict[str, list[str]] = {}
    affinity: list[str] = []
    for ln in lines[header_at + 1:]:
        if ln.lstrip().startswith("Legend"):
            break
        parts = ln.split()
        if not parts or parts[0] not in gpu_cols + nic_cols:
            continue
        cells = parts[1:1 + len(heads)]
        if len(cells) < len(heads):
            raise _fail(f"row {parts[0]} has {len(cells)} cells for {len(heads)} columns", source)
        bad = [c for c in cells if not _CELL.match(c)]
        if bad:
            raise _fail(f"row {parts[0]} has an unknown cell {bad[0]!r}", source)
        rows[parts[0]] = cells
        if parts[0] in gpu_cols and len(parts) > 1 + len(heads):
            affinity.append(parts[1 + len(heads)])
    missing = [g for g in gpu_cols if g not in rows]
    if missing:
        raise _fail(f"no row for {missing[0]}", source)
    n = len(gpu_cols)
    matrix = [rows[g][:n] for g in gpu_cols]
    for i in range(n):
        if matrix[i][i] != "X" or any(matrix[i][j] != matrix[j][i] for j in range(n)):
            raise _fail(f"the matrix is not symmetric with X on the diagonal (row {gpu_cols[i]})", source)
    nics = {k: [rows[g][n + m] for g in gpu_cols] for m, k in enumerate(nic_cols)}
    return Topology(gpu_cols, matrix, nics, affinity if len(affinity) == n else [])
