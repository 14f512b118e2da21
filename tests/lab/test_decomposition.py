"""A report whose numbers add up: the parts of the scaling loss and one rest sum to it, no share is printed above
100% or below 0, what-if experiments stand apart, the chart draws the measured exchange, and the contention advice
names the job's own exchange threads when nothing else runs."""

from __future__ import annotations

import math
import re

import pytest

from trainscale.lab.analysis import analyse
from trainscale.lab.contention import _contention_advice
from trainscale.lab.decomposition import decompose, share_text
from trainscale.lab.doctor_report import PLOTS, print_result, write_report
from trainscale.lab.invariants import violations
from trainscale.lab.ranks import rank_segments

CTX = {"bucket_mb": 25.0, "overlap": True, "workers": 0, "batch_size": 32, "slow_rank": -1, "sample_delay_ms": 0,
       "strategy_fields": [], "data_fields": []}


def summary(t, ranks=1, sps=None):
    return {"step_time_s": t, "rank_step_time_s": [t] * ranks, "rank_compute_s": [t / 2] * ranks,
            "measured_steps": 100, "step_time_spread": 0.01, "samples_per_s": sps or 32 * ranks / t,
            "data_wait_frac": 0.1, "allreduce_calls_per_step": 1, "bucket_mb": 25.0, "overlap": True, "threads": 1}


def result_of(times):
    runs = {(c, k): [summary(t + j, k) for j in (0.0, 0.0002)] for (c, k), t in times.items()}
    return analyse(runs, 2, CTX)


def cause(name, s, noise=0.0005):
    return {"name": name, "seconds_per_step": s, "noise_s": noise, "share": float("nan"), "verdict": "clear",
            "significant": True}


# Input removed makes the N-process step faster (-3 ms), communication is larger than the whole loss (+12 ms of 10).
ODD = {("base", 1): 0.010, ("no_data", 1): 0.008, ("no_comm", 1): 0.0075,
       ("base", 2): 0.020, ("no_data", 2): 0.021, ("no_comm", 2): 0.0085}


def test_parts_and_rest_add_up_to_the_loss_and_odd_parts_are_named_not_shared():
    res = result_of(ODD)
    d = res["decomposition"]
    assert sum(p["s"] for p in d["parts"]) + d["rest_s"] == pytest.approx(res["scaling_loss_s"], abs=1e-12)
    by = {p["name"]: p for p in d["parts"]}
    assert by["input"]["s"] < 0 and by["input"]["share"] is None and by["input"]["kind"] == "faster"
    assert by["communication"]["s"] > res["scaling_loss_s"] and by["communication"]["share"] is None
    assert by["communication"]["kind"].startswith("above_loss")
    assert all(p["share"] is None or 0 <= p["share"] <= 1 for p in d["parts"])
    assert violations(res) == []


def test_a_broken_decomposition_is_caught():
    res = result_of(ODD)
    res["decomposition"]["rest_s"] += 0.001
    res["decomposition"]["parts"][0]["share"] = 1.33
    found = violations(res)
    assert any("do not add up" in v or "add up to" in v for v in found) and any("outside 0..1" in v for v in found)


@pytest.mark.parametrize("s, text", [(0.004, "40%"), (-0.002, "made it faster"), (0.0102, "all (above, within noise)"),
                                     (0.02, "above the loss")])
def test_share_text_is_a_share_only_between_zero_and_the_loss(s, text):
    assert share_text(cause("communication", s), {"scaling_loss_s": 0.010, "scaling_loss_noise_s": 0.0005}) == text


def printed_percentages(text):
    return [int(x) for x in re.findall(r"(-?\d+)%", text)]


def test_the_report_prints_no_share_over_100_or_below_0_and_leads_with_bound_loss_change(tmp_path, capsys):
    res = result_of(ODD)
    res["causes"].append({**cause("threads", 0.004), "per_repeat_s": [0.004, 0.004], "apply_flags": {},
                          "evidence": "2 processes with 2 intra-op thread(s) each", "suggestion": "use --job.threads 2",
                          "interval_s": [0.003, 0.005]})
    res["what_if"] = [{"name": "threads", "gain_s": 0.004, "gain": 0.2, "verdict": "clear",
                       "evidence": "2 processes with 2 threads", "suggestion": "use --job.threads 2"}]
    doc = {**res, "result": True, "runs": [], "machine": "test", "apply": None,
           "config": {"nproc": 2, "repeat": 2, "train_args": ["--model", "mlp"], "threads_per_process": 1}}
    for name in PLOTS:  # the plots come from the runs, which this hand-made result has none of
        (tmp_path / name).write_bytes(b"")
    write_report(tmp_path, doc)
    md = (tmp_path / "doctor.md").read_text()
    shares = md.split("| share of loss |")[1].split("\n\n")[0]
    assert all(0 <= p <= 100 for p in printed_percentages(shares)), shares
    assert "(made it faster) " in shares and "(above the loss) " in shares  # said in the row, not as a share
    assert "|--:|:--|--:|--:|--:|--:|:--|:--|" in md  # the share column stays a column of numbers
    for line in re.findall(r".*of the scaling loss.*", md):
        assert all(0 <= p <= 100 for p in re.findall(r"(-?\d+)% of the scaling loss", line)), line
    paras = md.split("\n\n")
    first = [p for p in paras if p.startswith(("What bounds", "The scaling loss, ", "Verdict: "))]
    assert [p.split(" ")[0] for p in first[:3]][-2:] == ["The", "Verdict:"], first
    composition = next(p for p in paras if p.startswith("The scaling loss, "))
    assert "noise and unexplained" in composition
    # The thread trial is a what-if, apart from the parts of the loss.
    causes_table = md.split("## Causes")[1].split("##")[0]
    assert "| threads |" not in causes_table
    assert "## What-if experiments" in md and "| threads |" in md.split("## What-if experiments")[1]
    print_result(doc)
    out = capsys.readouterr().out
    assert all(0 <= p <= 100 for line in out.splitlines() if "loss" in line for p in printed_percentages(line)
               if "efficiency" not in line), out


def test_the_rank_chart_draws_the_measured_exchange():
    # Rank rows: [cycle, step, compute, data wait, runq main, runq crit, cpu, comm wait, arrival]; 144 ms steps with
    # 79 ms of exposed exchange, 40 ms of compute, no waiting for a slower rank.
    row = [0, 0.144, 0.040, 0.001, 0.0, 0.0, 0.04, 0.079, 0.0]
    run = {"step_time_s": 0.144, "rank_step_time_s": [0.144, 0.144], "rank_compute_s": [0.040, 0.040],
           "rank_steps": [[row] * 5, [row] * 5]}
    segs = rank_segments([run])
    assert [s["exchange"] for s in segs] == pytest.approx([0.079, 0.079])
    assert [s["rest of the step"] for s in segs] == pytest.approx([0.144 - 0.040 - 0.001 - 0.079] * 2)
    # A run without the accounting column keeps it in the rest, as before.
    old = {**run, "rank_steps": [[row[:4]] * 5, [row[:4]] * 5]}
    assert all(s["exchange"] == 0.0 and math.isclose(s["rest of the step"], 0.103) for s in rank_segments([old]))


def test_contention_advice_names_the_jobs_own_exchange_threads_when_nothing_else_runs():
    # 2 ranks, 1 thread each, 2 cores, nothing else running: Gloo's exchange threads are what competes.
    ctx = {"threads": 1, "workers": 0, "cores": 2, "backend": "gloo", "device": "cpu",
           "external": {"machine_cores": 2, "cores": 0.0, "top": []}}
    advice, flags = _contention_advice(ctx, 2)
    assert "own exchange threads" in advice and "Gloo" in advice and "nothing else seems to run" not in advice
    assert flags == {}
    on_gpu = {**ctx, "backend": "nccl", "device": "cuda"}
    assert "nothing else seems to run" in _contention_advice(on_gpu, 2)[0]


def test_decompose_of_a_job_without_loss_gives_no_share():
    d = decompose({"scaling_loss_s": -0.004, "scaling_loss_noise_s": 0.001,
                   "causes": [cause("communication", 0.003)]})
    assert d["parts"][0]["share"] is None and d["parts"][0]["kind"] == "no_loss"
    assert d["parts"][0]["s"] + d["rest_s"] == pytest.approx(-0.004)


def test_the_suites_report_check_catches_a_share_over_100():
    from summaries import printed_shares_out_of_range

    good = "The scaling loss, +10.000 ms/step ..., is made of: communication +4.000 ms (40%); input -1.000 ms " \
           "(made it faster).\n\nVerdict: communication costs +4.000 ms/step, 40% of the scaling loss (90% ..."
    assert printed_shares_out_of_range(good) == []
    bad = "Verdict: cpu_contention costs +4.267 ms/step, 133% of the scaling loss\n\n" \
          "| # | cause | ms/step | share of loss | 90% interval (ms) |\n|--:|:--|--:|--:|--:|\n" \
          "| - | threads | -13.649 | -424% | - |\n"
    assert printed_shares_out_of_range(bad) == ["133%", "-424%"]
