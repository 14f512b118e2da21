"""Re-run the doctor's first-level analysis on saved doctor folders: what a change to ``lab/analysis`` would have
said about runs already measured (no job is run).

Each folder is a ``trainscale doctor --out DIR`` result; its ``runs/phases_n*_r*.json`` are read back as the
doctor read them, with the second-level experiments where it ran them (``sleep_*``, ``profile_*``,
``threads*_*``), and the causes are printed before (``doctor.json``) and after (the current analysis).

    PYTHONPATH=src python benchmarks/campaigns/doctor_reanalyse.py DIR [DIR ...]

Last stdout line: one JSON object with each folder's top causes before and after.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from trainscale.config import Config, apply_overrides
from trainscale.lab.advice.suggest import context_from_config
from trainscale.lab.analysis import analyse
from trainscale.lab.experiments import phase_parts


def _nproc(f: Path) -> int:
    """Process count of a saved run, from its name (``<experiment>_n<k>_r<repeat>.json``)."""
    return int(re.search(r"_n(\d+)_", f.name).group(1))


def phased_runs(folder: Path) -> dict[tuple[str, int], list[dict]]:
    """The doctor's runs of ``folder``, one summary per phase and process count, in repeat order."""
    runs: dict[tuple[str, int], list[dict]] = {}
    for f in sorted(folder.glob("runs/phases_n*_r*.json")):
        k = _nproc(f)
        for phase, part in phase_parts(json.loads(f.read_text())).items():
            runs.setdefault((phase, k), []).append(part)
    return runs


def second_level(folder: Path, runs: dict[tuple[str, int], list[dict]]) -> dict:
    """The sleep test's runs (added to ``runs``), the operator profiles and the thread trials, as the doctor had them."""
    for f in sorted(folder.glob("runs/sleep_n*_r*.json")):
        runs.setdefault(("sleep", _nproc(f)), []).append(json.loads(f.read_text()))
    kw: dict = {}
    prof = []
    for f in sorted(folder.glob("runs/profile_n*_r0.json"), key=_nproc):
        path = Path(json.loads(f.read_text()).get("profile_json") or "")
        path = path if path.is_file() else f.with_suffix("") / path.name  # the folder may have moved
        if path.is_file():
            prof.append(json.loads(path.read_text()))
    if len(prof) == 2:
        kw["profiles"] = tuple(prof)
    threads: dict[int, list[dict]] = {}
    for f in sorted(folder.glob("runs/threads*_n*_r*.json")):
        threads.setdefault(int(re.match(r"threads(\d+)_", f.name).group(1)), []).append(json.loads(f.read_text()))
    if threads:
        kw["threads"] = threads
    return kw


def top(causes: list[dict], n: int = 3) -> list[tuple[str, str, float]]:
    return [(c["name"], c["verdict"], round(c["seconds_per_step"] * 1e3, 2)) for c in causes[:n]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", type=Path)
    out = {}
    for d in p.parse_args().folders:
        doc = json.loads((d / "doctor.json").read_text())
        runs = phased_runs(d)
        # The job's own settings, as the doctor had them (the bucket size decides where a wait for a core goes).
        train = doc["config"]["train"]
        cfg = apply_overrides(Config(), {f"{sec}.{k}": v for sec, fields in train.items() for k, v in fields.items()})
        ctx = {**context_from_config(cfg), "external": doc.get("external")}
        res = analyse(runs, doc["nproc"], ctx, **second_level(d, runs))
        out[str(d)] = {"before": top(doc["causes"]), "after": top(res["causes"]), "efficiency": res["efficiency"]}
        print(f"{d}: efficiency {res['efficiency']:.1%}\n  before {out[str(d)]['before']}\n  after  {out[str(d)]['after']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
