"""The lab on several nodes: ``trainscale bench``, ``doctor`` and ``plan calibrate`` run as the same command on
every node.

Node 0 runs the experiments: it decides what to run next from what it measured (the doctor's repeats and its
second level depend on the analysis), and only it reads the summaries, which rank 0 writes there. Before it
launches a run that spans the nodes, it writes the run's command into a c10d ``TCPStore`` it hosts on the
master's port + 1; on every other node the same command follows: it reads each announced run, launches that
node's part (the same launcher command with its own ``--node-rank``) and meets node 0's part at the run's own
rendezvous. Runs on node 0 alone (the doctor's 1-process references) are not announced. The node options come
from the command line, else from the scheduler's variables (SLURM, Kubeflow), as ``trainscale launch`` reads
them.

Example (two nodes; the same line on each, with its ``--node-rank``)::

    trainscale doctor --nproc 4 --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from . import jobs
from .config import ConfigError
from .distributed.cluster import unplaced
from .jobs import LauncherOptions, communicate_or_kill
from .reporting.console import err_console

__all__ = ["add_node_options", "launcher_options", "leading", "announce", "follow", "PORT_OFFSET"]

PORT_OFFSET = 1  # the lab's store listens on the master's port + this (the master's own port is each run's)
PREFIX = "trainscale-lab/"
_leader: Any = None  # node 0's store while it leads


def add_node_options(p: argparse.ArgumentParser) -> None:
    """``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``, ``--rdzv-endpoint`` (as the launcher's)."""
    g = p.add_argument_group("several nodes (run the same command on each; the scheduler's variables also work)")
    g.add_argument("--nnodes", default=None, help="nodes of every multi-process run (default: the scheduler's, or 1)")
    g.add_argument("--node-rank", type=int, default=None, help="this node's rank; node 0 runs the experiments")
    g.add_argument("--master-addr", help="node 0's address (each run's rendezvous; the lab's store is on port + 1)")
    g.add_argument("--master-port", type=int, help="each run's rendezvous port (default 29500)")
    g.add_argument("--rdzv-endpoint", help="host:port of a c10d rendezvous instead of a static one")


def launcher_options(args: argparse.Namespace) -> LauncherOptions:
    """The runs' node options: those given on the command line, else the scheduler's (one line if they are bad)."""
    given = any(getattr(args, k) is not None for k in ("nnodes", "node_rank", "master_addr", "master_port",
                                                        "rdzv_endpoint"))
    if given:
        opts = LauncherOptions(args.nnodes or "1", args.node_rank or 0, args.master_addr, args.master_port,
                               args.rdzv_endpoint)
    else:
        from .distributed.cluster import resolve

        c = resolve(role="launcher")
        if not c.multi_node:
            return LauncherOptions()
        opts = LauncherOptions(c.nnodes, c.node_rank, c.master_addr, c.master_port)
    if opts.node_rank < 0 or opts.node_rank >= nodes(opts):
        raise ConfigError("--node-rank", opts.node_rank, f"from 0 to {nodes(opts) - 1} (--nnodes {opts.nnodes})")
    return opts


def nodes(opts: LauncherOptions) -> int:
    """The most nodes a run spans (an elastic ``MIN:MAX`` counts its maximum)."""
    try:
        return int(str(opts.nnodes).split(":")[-1])
    except ValueError:
        raise ConfigError("--nnodes", opts.nnodes, "a number of nodes, or MIN:MAX") from None


def _store(opts: LauncherOptions, leader: bool, timeout_s: float) -> Any:
    from torch.distributed import TCPStore

    if opts.rdzv_endpoint:
        host, _, port = opts.rdzv_endpoint.rpartition(":")
        host, port_n = host or "127.0.0.1", int(port or 29400)
    else:
        host, port_n = opts.master_addr or "127.0.0.1", opts.master_port or 29500
    return TCPStore(host, port_n + PORT_OFFSET, is_master=leader, timeout=timedelta(seconds=timeout_s),
                    wait_for_workers=False)


@contextlib.contextmanager
def leading(opts: LauncherOptions, ack_s: float = 30.0) -> Iterator[None]:
    """Node 0 of a multi-node lab: announce its runs while inside; at the end tell the other nodes to stop."""
    global _leader
    if not opts.multi_node or nodes(opts) < 2:
        yield
        return
    try:
        _leader = _store(opts, leader=True, timeout_s=ack_s)
    except (RuntimeError, OSError) as e:  # the port above the master's is taken
        raise ConfigError("--master-port", opts.master_port or opts.rdzv_endpoint, f"the lab's store needs the port "
                          f"above it free on node 0 ({e})") from None
    _leader.set(PREFIX + "next", "0")
    jobs.on_launch = announce
    ok = False
    try:
        yield
        ok = True
    finally:
        store, _leader, jobs.on_launch = _leader, None, None
        k = int(store.get(PREFIX + "next"))
        store.set(PREFIX + f"run/{k}", json.dumps({"done": True, "ok": ok}))
        # The store lives in this process: wait (a little) until every other node has read the end.
        deadline, acks = time.monotonic() + ack_s, [PREFIX + f"ack/{r}" for r in range(1, nodes(opts))]
        while not store.check(acks) and time.monotonic() < deadline:
            time.sleep(0.2)


def announce(argv: list[str], env: dict[str, str], label: str) -> None:
    """Node 0: the other nodes launch their part of this run (``jobs.on_launch`` while node 0 leads)."""
    k = int(_leader.get(PREFIX + "next"))
    _leader.set(PREFIX + f"run/{k}", json.dumps({"argv": argv, "env": env, "label": label}))
    _leader.set(PREFIX + "next", str(k + 1))


def _as_node(argv: list[str], node_rank: int) -> list[str]:
    """Node 0's launcher command with this node's ``--node-rank``."""
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a == "--node-rank":
            out[i + 1] = str(node_rank)
    return out


def follow(opts: LauncherOptions, run_timeout: float) -> int:
    """Every node but 0: launch this node's part of each run node 0 announces, until it says it is done.

    A gap between two announced runs holds node 0's own runs and analysis (up to two runs on node 0 alone),
    so the wait for the next one is bounded by three run timeouts. Returns 0 if node 0 finished its work.
    """
    wait_s = 3 * run_timeout + 300
    err_console.print(f"node {opts.node_rank}: following node 0's runs (its lab store: "
                      f"{opts.rdzv_endpoint or (opts.master_addr or '127.0.0.1')}, port + {PORT_OFFSET})")
    try:
        store = _store(opts, leader=False, timeout_s=wait_s)
    except (RuntimeError, OSError) as e:
        raise ConfigError("--master-addr", opts.master_addr or opts.rdzv_endpoint,
                          f"node 0's lab did not answer within {wait_s:g}s ({e})") from None
    k, failed = 0, 0
    while True:
        try:
            msg = json.loads(store.get(PREFIX + f"run/{k}"))
        except (RuntimeError, OSError) as e:
            err_console.print(f"node {opts.node_rank}: node 0 announced no run #{k} within {wait_s:g}s ({e})")
            return 1
        if msg.get("done"):
            store.set(PREFIX + f"ack/{opts.node_rank}", "1")
            err_console.print(f"node {opts.node_rank}: node 0 is done; this node took part in {k} run(s)"
                              f"{f', {failed} failed' if failed else ''}; node 0 writes the report")
            return 0 if msg.get("ok") else 1
        t0 = time.monotonic()
        env = {**unplaced(os.environ), "TRAINSCALE_TABLE_PRINTED": "1", "PYTHONUNBUFFERED": "1", **msg["env"]}
        try:
            rc = communicate_or_kill(_as_node(msg["argv"], opts.node_rank), env, run_timeout)[0]
            how = "done" if rc == 0 else f"failed (exit code {rc})"
        except subprocess.TimeoutExpired:  # a run's failure is node 0's to report: keep following
            rc, how = 1, f"ended after {run_timeout:g}s"
        failed += rc != 0
        err_console.print(f"node {opts.node_rank}: run #{k} ({msg['label']}) {how} in {time.monotonic() - t0:.1f}s")
        k += 1
