"""Two "nodes" on one host, each a ``trainscale launch`` agent in its own session; one dies and comes back.

A node's death is its launcher and every process under it killed at once (SIGKILL): torchrun starts each rank
in a session of its own, so killing the launcher alone would leave its rank running on.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from clitools import REPO

STEP = re.compile(r"\[rank0\] step (\d+)/")


@dataclass
class Node:
    """One node's launcher and the lines it printed, each with the time it arrived."""

    proc: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)

    def kill(self) -> None:
        """The node dies: its launcher and every process under it, at once."""
        try:
            tree = [*psutil.Process(self.proc.pid).children(recursive=True), psutil.Process(self.proc.pid)]
        except psutil.Error:
            tree = []
        for q in tree:
            try:
                q.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        self.proc.wait()

    def hosts_port(self, port: int) -> bool:
        """True when this launcher listens on ``port`` (c10d's rendezvous store lives in one agent)."""
        try:
            return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                       for c in psutil.Process(self.proc.pid).net_connections())
        except psutil.Error:
            return False

    @property
    def text(self) -> str:
        return "\n".join(ln for _, ln in self.lines)


def start_node(launch_args: list[str], env: dict[str, str] | None = None) -> Node:
    """``trainscale launch LAUNCH_ARGS`` as one node, its output read line by line as it comes."""
    full = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        full.pop(k, None)
    p = subprocess.Popen([sys.executable, "-m", "trainscale", "launch", *launch_args], env=full, cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    node = Node(p)

    def read() -> None:
        for ln in p.stdout:  # type: ignore[union-attr]
            node.lines.append((time.monotonic(), ln.rstrip()))

    threading.Thread(target=read, daemon=True).start()
    return node


def wait_nodes(nodes: list[Node], timeout: float) -> list[int | None]:
    """Exit codes; a node still running at ``timeout`` is killed with everything under it (code None)."""
    deadline, codes = time.monotonic() + timeout, []
    for n in nodes:
        try:
            codes.append(n.proc.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            n.kill()
            codes.append(None)
    time.sleep(0.3)  # the reader threads take the last lines
    return codes


def first_step_after(nodes: list[Node], t: float) -> tuple[float, int] | None:
    """(seconds after ``t``, step) of the first rank-0 progress line printed after ``t`` by any node."""
    hits = [(at - t, int(m.group(1))) for n in nodes for at, ln in n.lines if at > t and (m := STEP.search(ln))]
    return min(hits) if hits else None


def wait_for_file(path: Path, nodes: list[Node], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and all(n.proc.poll() is None for n in nodes):
        if path.exists():
            return True
        time.sleep(0.02)
    return path.exists()
