"""Two "nodes" on one host joined by a slow link: flat against hierarchical all-reduce, and the planner's forecast.

Each node is a network namespace: its ranks talk over the namespace's own loopback, and the nodes meet over a
veth pair whose two ends' egress is limited by ``tc qdisc ... tbf`` to ``--rate`` (rate only: this host has no
netem for delay). Each node's ``trainscale launch --nnodes 2`` runs inside its namespace (``ip netns exec``)
with a static rendezvous on node 0's veth address and ``GLOO_SOCKET_IFNAME`` set to its veth. At each model
width the same job runs flat and hierarchical (``--strategy.hierarchical true``: node membership from the
launcher); then ``trainscale plan calibrate --nnodes 2`` across the two nodes (the same command in each
namespace: each node's own all-reduce, the all-reduce over both, flat and hierarchical, the link alone) and
``trainscale plan --calibration`` forecast both. Needs root and ``ip``/``tc``; the namespaces and links are
removed even on failure.

    python benchmarks/slow_link.py --rate 200mbit --widths 256,1024,2048 --steps 12

Last stdout line: one JSON object (per width: flat and hierarchical step time, the forecasts and their errors).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import emit

from trainscale.config import ConfigError
from trainscale.config_io import int_list

SUBNET = "10.77.0"  # only inside the namespaces made here: the addresses never reach this host's own stack
JOB = ["--model", "mlp", "--data", "digits", "--data.batch_size", "32", "--log.progress", "none"]


@dataclass(frozen=True)
class Link:
    """Two namespaces joined by a rate-limited veth pair: node k is ``ns[k]``, its end ``veth[k]``, ``addr[k]``."""

    ns: tuple[str, str]
    veth: tuple[str, str]
    addr: tuple[str, str]
    rate: str


class NamespaceError(RuntimeError):
    """The namespaces or the limited link could not be made (one line: the command and its error)."""


def why_not() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    return f"{' and '.join(missing)} not found (iproute2)" if missing else None


def _sh(*argv: str) -> None:
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")


@contextlib.contextmanager
def slow_link(rate: str, tag: str | None = None) -> Iterator[Link]:
    """Make the two namespaces and the limited veth pair; remove both namespaces (and so the pair) on exit."""
    tag = tag or str(os.getpid())
    link = Link((f"tsl{tag}a", f"tsl{tag}b"), (f"tsv{tag}a", f"tsv{tag}b"), (f"{SUBNET}.1", f"{SUBNET}.2"), rate)
    made: list[str] = []
    try:
        try:
            _make(link, made)
        except RuntimeError as e:
            raise NamespaceError(f"cannot make network namespaces here: {e}") from None
        yield link
    finally:
        with contextlib.suppress(RuntimeError):
            _sh("ip", "link", "del", link.veth[0])  # only if it was never moved into a namespace
        for ns in made:
            with contextlib.suppress(RuntimeError):
                _sh("ip", "netns", "del", ns)  # deletes the veth end inside it, and so the pair


def _make(link: Link, made: list[str]) -> None:
    """The namespaces (each appended to ``made`` as it exists, for the clean-up), the pair, its limit."""
    for ns in link.ns:
        _sh("ip", "netns", "add", ns)
        made.append(ns)
    _sh("ip", "link", "add", link.veth[0], "type", "veth", "peer", "name", link.veth[1])
    for ns, dev, addr in zip(link.ns, link.veth, link.addr):
        _sh("ip", "link", "set", dev, "netns", ns)
        _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        _sh("ip", "-n", ns, "link", "set", dev, "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")  # the node's ranks talk over its own loopback
        # tbf on each end's egress: the rate of each direction of the inter-node link.
        _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", link.rate,
            "burst", "64kb", "latency", "400ms")


def run_two_nodes(link: Link, args: list[str], json_path: Path, nproc: int = 2, timeout: float = 600) -> dict:
    """One job on both nodes: each node's launcher in its namespace; rank 0's summary."""
    commands: list[tuple[list[str], dict[str, str]]] = []
    for k in (0, 1):
        env = {**os.environ, "GLOO_SOCKET_IFNAME": link.veth[k], "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        argv = ["ip", "netns", "exec", link.ns[k], sys.executable, "-m", "trainscale", "launch", "--nnodes", "2",
                "--node-rank", str(k), "--master-addr", link.addr[0], "--master-port", "29500", "--nproc-per-node",
                str(nproc), "-m", "trainscale", "train", *args, "--json", str(json_path)]
        commands.append((argv, env))
    procs, outs = _both_nodes(commands, timeout)
    if any(p.returncode for p in procs):
        raise RuntimeError(f"two-node run failed ({[p.returncode for p in procs]}):\n" + "\n".join(o[-2000:]
                                                                                                 for o in outs))
    return json.loads(json_path.read_text())


def _both_nodes(commands: list[tuple[list[str], dict[str, str]]], timeout: float
                ) -> tuple[list[subprocess.Popen], list[str]]:
    """Start each node's command and wait for both; on a timeout, end each with its whole session."""
    # A session each, so that a timeout ends the launcher and its ranks together (ip netns exec execs it).
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for argv, env in commands]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return procs, outs


def doctor_two_nodes(link: Link, job: list[str], out: Path, timeout: float = 900) -> dict:
    """``trainscale doctor --nproc 2 --quick`` in each namespace, placed by Kubeflow's ``PET_*`` as in two pods.

    Node 0's doctor runs the experiments (its 1-process references alone) and writes the report; node 1's
    follows the runs that span both nodes (``trainscale.nodes``).
    """
    commands: list[tuple[list[str], dict[str, str]]] = []
    for k in (0, 1):
        env = {**os.environ, "GLOO_SOCKET_IFNAME": link.veth[k], "OMP_NUM_THREADS": "1", "PET_NNODES": "2",
               "PET_NODE_RANK": str(k), "PET_MASTER_ADDR": link.addr[0], "PET_MASTER_PORT": "29500"}
        argv = ["ip", "netns", "exec", link.ns[k], sys.executable, "-m", "trainscale", "doctor", "--nproc", "2",
                "--quick", "--repeat", "2", "--budget", "1", "--cycles", "3", "--phase-steps", "4",
                "--out", str(out / f"node{k}"), *[x for x in job if x not in ("--log.progress", "none")]]
        commands.append((argv, env))
    procs, outs = _both_nodes(commands, timeout)
    doc = json.loads((out / "node0" / "doctor.json").read_text()) if (out / "node0" / "doctor.json").is_file() else {}
    causes = [{"name": c["name"], "share": c.get("share"), "verdict": c.get("verdict"),
               "significant": c.get("significant")} for c in doc.get("causes", [])]
    return {"exit_codes": [p.returncode for p in procs], "causes": causes, "error": doc.get("error"),
            "tail": [o.strip().splitlines()[-12:] for o in outs]}


def _cli(*argv: str, timeout: float = 900) -> str:
    p = subprocess.run([sys.executable, "-m", "trainscale", *argv], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if p.returncode != 0:
        raise RuntimeError(f"trainscale {' '.join(argv)} failed: {p.stderr[-2000:]}")
    return p.stdout


def calibrate_two_nodes(link: Link, job: list[str], cal: Path, timeout: float = 900) -> None:
    """``trainscale plan calibrate --nproc 2`` across the two nodes: the same command in each namespace."""
    commands: list[tuple[list[str], dict[str, str]]] = []
    for k in (0, 1):
        env = {**os.environ, "GLOO_SOCKET_IFNAME": link.veth[k], "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        argv = ["ip", "netns", "exec", link.ns[k], sys.executable, "-m", "trainscale", "plan", "calibrate",
                "--nproc", "2", "--nnodes", "2", "--node-rank", str(k), "--master-addr", link.addr[0],
                "--master-port", "29600", "--out", str(cal) if k == 0 else str(cal) + ".node1", *job]
        commands.append((argv, env))
    procs, outs = _both_nodes(commands, timeout)
    if any(p.returncode for p in procs) or not cal.is_file():
        raise RuntimeError(f"calibration across the nodes failed ({[p.returncode for p in procs]}):\n"
                           + "\n".join(o[-2000:] for o in outs))


def calibrated(cal: dict) -> dict:
    """What the calibration measured across the nodes at 2 per node: both skeleton steps, both all-reduce fits."""
    def fit(d: dict | None) -> dict | None:
        return {k: d[k] for k in ("alpha", "beta", "cpu_alpha", "cpu_beta", "residual")} if d else None

    return {"skeleton_flat_s": cal["replay"]["4"]["step_s"],
            "skeleton_hier_s": cal.get("replay_hier", {}).get("4", {}).get("step_s"),
            "flat": fit(cal["across"].get("2")), "hier": fit(cal.get("across_hier", {}).get("2")),
            "link": fit(cal["across"].get("1"))}


def forecast(cal: Path, hierarchical: bool, out: Path) -> dict:
    """``trainscale plan`` of 2 nodes x 2 from the calibration measured across the two nodes."""
    argv = ["plan", "--calibration", str(cal), "--nproc", "4", "--out", str(out), "--json", str(out / "plan.json"),
            *(["--hierarchical"] if hierarchical else [])]
    _cli(*argv)
    doc = json.loads((out / "plan.json").read_text())
    point = next(p for p in doc["points"] if p["world_size"] == 4)
    return {"step_s": point["step_time_s"], "comm_s": point["comm_exposed_s"], "bound": point["bound"],
            "nodes": point["nodes"], "argv": argv}


def rate_gbps(rate: str) -> float:
    """tc's rate (``200mbit``, ``1gbit``) in Gbit/s."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)bit", rate)
    if not m:
        raise SystemExit(f"--rate {rate!r}: expected tc's NUMBER[k|m|g]bit, e.g. 200mbit")
    return float(m.group(1)) * {"k": 1e-6, "m": 1e-3, "g": 1.0}[m.group(2)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="200mbit", help="the inter-node link's rate per direction (tc tbf)")
    p.add_argument("--widths", default="256,1024,2048", help="mlp widths: the gradient sizes")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--no-plan", action="store_true", help="measure only (no calibration, no forecast)")
    p.add_argument("--doctor-width", type=int, default=0, help="also run the doctor on both nodes at this width")
    a = p.parse_args()
    reason = why_not()
    if reason:
        raise SystemExit(f"slow_link: cannot make network namespaces here: {reason}")
    if a.steps < 4:
        raise SystemExit(f"slow_link: --steps {a.steps}: at least 4 (the first steps are not timed)")
    rate_gbps(a.rate)  # checked before any namespace is made
    try:
        widths = int_list(a.widths, "--widths", "comma-separated mlp widths >= 1, e.g. 256,1024,2048")
    except ConfigError as e:
        raise SystemExit(f"slow_link: {e}") from None
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        d = stack.enter_context(tempfile.TemporaryDirectory())
        try:
            link = stack.enter_context(slow_link(a.rate))
        except NamespaceError as e:
            raise SystemExit(f"slow_link: {e}") from None
        for w in widths:
            job = [*JOB, "--model.width", str(w), "--steps", str(a.steps)]
            row: dict[str, Any] = {"width": w}
            for mode, extra in (("flat", []), ("hier", ["--strategy.hierarchical", "true"])):
                s = run_two_nodes(link, [*job, *extra], Path(d) / f"{mode}{w}.json")
                row[mode] = {"step_s": s["step_time_s"], "spread": s["step_time_spread"], "nodes": s["nodes"]}
                print(f"width {w} {mode}: {s['step_time_s'] * 1e3:.1f} ms/step", file=sys.stderr, flush=True)
            row["hier_speedup"] = row["flat"]["step_s"] / row["hier"]["step_s"]
            # The doctor's communication experiment, by hand: the same job with the gradient exchange off.
            s = run_two_nodes(link, [*job, "--ablate.comm", "true"], Path(d) / f"nocomm{w}.json")
            row["no_comm_step_s"] = s["step_time_s"]
            for mode in ("flat", "hier"):
                row[mode]["comm_share"] = 1 - s["step_time_s"] / row[mode]["step_s"]
            if not a.no_plan:
                cal = Path(d) / f"cal{w}.json"
                # The lab sets progress and steps itself: the job's model and data only.
                calibrate_two_nodes(link, [*JOB[:-2], "--model.width", str(w)], cal)
                row["grad_mb"] = json.loads(cal.read_text())["params"] * 4 / 1e6
                row["calibrated"] = calibrated(json.loads(cal.read_text()))
                for mode in ("flat", "hier"):
                    f = forecast(cal, mode == "hier", Path(d) / f"plan-{mode}{w}")
                    row[mode]["forecast_s"], row[mode]["forecast_bound"] = f["step_s"], f["bound"]
                    row[mode]["plan_command"] = " ".join(["trainscale", *f["argv"]])  # the inputs, to re-type
                    row[mode]["forecast_error"] = f["step_s"] / row[mode]["step_s"] - 1
            rows.append(row)
        doctor = (doctor_two_nodes(link, [*JOB, "--model.width", str(a.doctor_width)], Path(d) / "doctor")
                  if a.doctor_width else None)
    emit({"benchmark": "slow_link", "rate": a.rate, "nodes": 2, "procs_per_node": 2, "steps": a.steps,
          "rows": rows, "doctor": doctor})


if __name__ == "__main__":
    main()
