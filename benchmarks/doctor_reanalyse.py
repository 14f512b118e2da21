"""Re-run the doctor's first-level analysis on saved doctor folders: what a change to ``lab/analysis`` would have
said about runs already measured (no job is run).

Each folder is a ``trainscale doctor --out DIR`` result; its ``runs/phases_n*_r*.json`` are read back as the
doctor read them, and the causes are printed before (``doctor.json``) and after (the current analysis). The
second-level experiments (sleep test, profiles, thread counts) are not re-read: their causes are left out.

    PYTHONPATH=src python benchmarks/doctor_reanalyse.py DIR [DIR ...]

Last stdout line: one JSON object with each folder's top causes before and after.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from trainscale.lab.analysis import analyse
from trainscale.lab.doctor import phase_parts


def phased_runs(folder: Path) -> dict[tuple[str, int], list[dict]]:
    """The doctor's runs of ``folder``, one summary per phase and process count, in repeat order."""
    runs: dict[tuple[str, int], list[dict]] = {}
    for f in sorted(folder.glob("runs/phases_n*_r*.json")):
        k = int(re.search(r"_n(\d+)_", f.name).group(1))
        for phase, part in phase_parts(json.loads(f.read_text())).items():
            runs.setdefault((phase, k), []).append(part)
    return runs


def top(causes: list[dict], n: int = 3) -> list[tuple[str, str, float]]:
    return [(c["name"], c["verdict"], round(c["seconds_per_step"] * 1e3, 2)) for c in causes[:n]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", type=Path)
    out = {}
    for d in p.parse_args().folders:
        doc = json.loads((d / "doctor.json").read_text())
        res = analyse(phased_runs(d), doc["nproc"], {"external": doc.get("external")})
        out[str(d)] = {"before": top(doc["causes"]), "after": top(res["causes"]), "efficiency": res["efficiency"]}
        print(f"{d}: efficiency {res['efficiency']:.1%}\n  before {out[str(d)]['before']}\n  after  {out[str(d)]['after']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
