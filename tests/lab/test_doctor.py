"""The doctor on planted faults: each is named first with a share above the noise; a clean job gets no
false cause. Slow by nature (each doctor runs a dozen short jobs); small models, few steps, 2 repeats."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from clitools import read_json, run_cli
from trainscale.lab.doctor_report import _share_phrase

HERE = Path(__file__).parent
ENV = {"PYTHONPATH": f"{HERE}:{Path(__file__).parents[2] / 'src'}"}
JOB = ["--data", "synthetic", "--data.image_size", "8", "--data.channels", "1", "--data.train_size", "512",
       "--data.eval_size", "16", "--job.threads", "1", "--steps", "30", "--log.skip_first", "3"]

pytestmark = [pytest.mark.dist, pytest.mark.slow]


# Planted faults (and a CPU hog) are large: two repeats name them (``--budget 1`` stops the sequential repeats
# there, halving the launches). The clean job keeps the default budget: repeating while a cause is undecided is
# what keeps it clean.
PLANTED = ("--budget", "1")


def doctor(tmp_path, *args, timeout=840):
    out = tmp_path / "doc"
    r = run_cli(["doctor", "--nproc", "2", "--repeat", "2", "--cycles", "4", "--out", str(out), *JOB, *args],
                timeout=timeout,
                env=ENV)
    assert r.rc == 0, r.text
    for name in ("doctor.json", "doctor.md", "doctor.html", "causes.png", "experiments.png"):
        assert (out / name).is_file(), name
    return read_json(out / "doctor.json"), r


def first(doc):
    top = doc["causes"][0]
    # significant: above its noise in every repeat, and at least 5% of the loss
    assert top["significant"] and top["low_s"] > 0, doc["causes"]
    assert top["share"] >= 0.05
    return top


@pytest.mark.full  # a user's script's slow input (test_lab_scripts) stays
@pytest.mark.timeout(900)
def test_slow_input_pipeline_is_named_first(tmp_path):
    doc, r = doctor(tmp_path, *PLANTED, "--quick", "--data.sample_delay_ms", "1.5", "--batch-size", "16")
    top = first(doc)
    assert top["name"] == "input", doc["causes"]
    assert top["share"] > 0.5 and "data.sample_delay_ms" in top["suggestion"]


@pytest.mark.timeout(900)
def test_tiny_buckets_are_named_and_apply_measures_the_gain(tmp_path):
    doc, r = doctor(tmp_path, *PLANTED, "--quick", "--apply", "--strategy.bucket_mb", "0", "--model.depth", "16",
                    "--model.width", "64")
    top = first(doc)
    # Beside other work too (this suite shares its machine): the 34 all-reduces per step each wake ranks that then
    # wait for a core, and fusing them removes that wait, so it stays with the exchange.
    assert top["name"] == "communication", doc["causes"]
    assert top["apply_flags"] == {"strategy.bucket_mb": "25"}
    a = doc["apply"]
    assert a["cause"] == top["name"] and a["step_time_after_s"] < a["step_time_before_s"]
    assert "applied: --strategy.bucket_mb 25" in r.out
    # Judged on throughput against the measured noise: a gain whose whole interval is above zero is adopted.
    assert a["decision"] == "adopt" and a["gain_interval"][0] > 0 and a["text"].endswith(": adopt")
    _check_report(tmp_path / "doc", doc)


@pytest.mark.full  # its parts: tests/lab/test_accounting.py, tests/train/test_rank_accounting.py
@pytest.mark.timeout(900)
def test_an_fsdp_jobs_exchange_is_its_measured_wait_with_its_bytes(tmp_path):
    # FSDP all-gathers in forward, so no step runs without communication: the doctor measures each step's
    # exposed wait in the collectives instead of taking the exchange out, and names FSDP's bytes.
    doc, r = doctor(tmp_path, *PLANTED, "--quick", "--strategy.fsdp", "true", "--model.depth", "8",
                    "--model.width", "64")
    assert all("--ablate.phases base,no_data " in x["command"] for x in doc["runs"]), doc["runs"]
    assert not any(x["experiment"].startswith("sleep") for x in doc["runs"])
    comm = next(c for c in doc["causes"] if c["name"] == "communication")
    assert comm["evidence"].startswith("FSDP over 9 unit(s): all-gather "), comm["evidence"]
    assert comm["apply_flags"] == {"strategy.reshard_after_forward": "false"}

    def exposed(k):  # the median measured wait in collectives of rank 0's no_data steps, at k processes
        s = read_json(tmp_path / "doc" / "runs" / f"phases_n{k}_r0.json")
        return statistics.median(row[7] for row in s["phases"]["no_data"]["rank_steps"][0])
    assert exposed(2) > exposed(1) >= 0
    first(doc)  # on a quiet machine FSDP's extra CPU work per unit can come first (compute_interference, clear)
    cpu = next(c for c in doc["causes"] if c["name"] == "cpu_contention")
    if not comm["significant"]:  # beside other work: the ranks' wait for a core inside the collectives
        assert cpu["significant"] and max(cpu["moved_from"], key=lambda m: m["s"])["cause"] == "communication", \
            doc["causes"]


def _check_report(out, doc):
    """What a reader relies on in doctor.md/html: verdict and change first, text left, each command once."""
    md = (out / "doctor.md").read_text()
    # The first screen in the order a user asks: what bounds the step, what the loss is made of, the change.
    paras = md.split("\n\n")[1:4]
    if not paras[0].startswith("What bounds the step"):
        paras = ["", *paras]
    assert paras[1].startswith("The scaling loss, ") and "noise and unexplained" in paras[1], paras
    first = paras[2]
    top = next(c for c in doc["causes"] if c["name"] != "threads")  # the thread trial is a what-if, reported apart
    # Its share is a share (0-100%) or, above the loss, said as what it is (tests/summaries.py checks every report).
    assert first.startswith(f"Verdict: {top['name']} costs {top['seconds_per_step'] * 1e3:+.3f} ms/step, "
                            f"{_share_phrase(top, doc)} (90% interval "), first
    change = md.split("Change:\n\n```\n", 1)[1].split("\n```", 1)[0]
    assert change.startswith("trainscale train --nproc 2 ") and change.endswith("--strategy.bucket_mb 25")
    assert "--strategy.bucket_mb 0" not in change  # the job's own value of the changed field is replaced
    assert md.index("Change:") < md.index("Applied:") < md.index("## Causes")
    runs = md.split("## Runs", 1)[1].split("```\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert len(runs) == len(set(runs)) == len({r["command"] for r in doc["runs"]})
    # Markdown: text columns left-aligned, numbers right (cause, verdict, evidence vs ms/step, share).
    assert "| # | cause | ms/step | share of loss | 90% interval (ms) | per repeat (ms) | verdict | evidence |\n" \
           "|--:|:--|--:|--:|--:|--:|:--|:--|" in md
    page = (out / "doctor.html").read_text()
    assert f"<td>{top['name']}</td>" in page and 'class="num"' in page
    assert "padding:.3em .6em;text-align:left" in page
    assert "ranks.png" in md and (out / "ranks.png").stat().st_size > 0
    # Every run wrote its metrics into a folder of its own, none into the shared runs/ folder.
    summaries = sorted((out / "runs").glob("*.json"))
    assert summaries and not (out / "runs" / "metrics.jsonl").exists()
    for s in summaries:
        assert (s.with_suffix("") / "metrics.jsonl").is_file(), s


# A slow rank named by rank: the live monitor (tests/train/test_stragglers.py) and the matrix's straggler cells;
# the per-rank accounting the doctor reads: the neighbour and clean-job tests here.
@pytest.mark.full
@pytest.mark.timeout(900)
def test_straggler_is_named_by_rank(tmp_path):
    doc, r = doctor(tmp_path, *PLANTED, "--quick", "--job.slow_rank", "1", "--job.slow_factor", "5",
                    "--model.width", "256", "--batch-size", "64")
    top = first(doc)
    assert top["name"] == "straggler" and top["rank"] == 1 and "straggler (rank 1)" in r.out, doc["causes"]
    # It arrives last at the exchange (its gradients come late), and the others' wait for it is measured.
    last = doc["bottleneck"]["last_arrivals"]
    assert last[1] > 0.9 * sum(last), last
    assert doc["bottleneck"]["shares"]["waiting_for_peers"] > 0.2, doc["bottleneck"]


@pytest.mark.full  # the matrix's second-level cells check it too
@pytest.mark.timeout(900)
def test_operator_slow_only_on_several_processes_is_named(tmp_path):
    doc, r = doctor(tmp_path, *PLANTED, "--model.name", "planted_models:slow_op_mlp")
    top = first(doc)
    assert top["name"] == "slow_operator", doc["causes"]
    assert top["operator"] == "aten::sort"
    names = {c["name"] for c in doc["causes"]}
    assert {"framework_overhead", "threads", "slow_operator"} <= names  # the second-level experiments ran


@pytest.mark.timeout(900)
def test_clean_job_reports_no_false_cause(tmp_path):
    # A budget keeps the suite's time steady: more repeats could only turn a likely cause clear, never hide one.
    doc, r = doctor(tmp_path, "--quick", "--budget", "60")
    planted_kinds = {"input", "straggler", "slow_operator"}
    false = [c for c in doc["causes"] if c["name"] in planted_kinds and c["significant"]]
    assert not false, doc["causes"]
    for c in doc["causes"]:
        if c["significant"]:
            assert c["low_s"] > 0


@pytest.mark.timeout(900)
def test_a_busy_neighbour_is_named_with_its_pid_on_the_default_job(tmp_path):
    """The default job (mlp on digits) beside a CPU-bound process: the doctor says who else used the cores."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        out = tmp_path / "doc"
        r = run_cli(["doctor", "--nproc", "2", "--repeat", "2", *PLANTED, "--cycles", "4", "--quick",
                     "--out", str(out)], timeout=840, env=ENV)
    finally:
        hog.kill()
        hog.wait()
    assert r.rc == 0, r.text
    doc = read_json(out / "doctor.json")
    assert any(p["pid"] == hog.pid for p in doc["external"]["top"]), doc["external"]
    # Measured (the ranks' run-queue wait) where schedstat exists, else the time-sharing model: either names it.
    ext = [c for c in doc["causes"] if c["name"] in ("cpu_contention", "external_load")]
    named = ext and [p["pid"] for p in ext[0].get("processes") or ext[0].get("who", {}).get("outside", [])]
    assert named and hog.pid in named, doc["causes"]
    assert doc["config"]["threads_per_process"] == 1  # 1 and 2 processes compared with equal threads
    assert (ext[0]["name"] in r.out and doc["efficiency"] <= 1.0
            or "Efficiency above 100%" in (out / "doctor.md").read_text())
    assert doc["invariants"] == []
