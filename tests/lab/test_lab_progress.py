"""The lab's progress where rich draws nothing (a batch job's log, a pipe): a line per run done."""

from __future__ import annotations

import re

from trainscale.lab.progress import LabProgress


def test_each_run_done_is_one_line_and_nothing_comes_before_the_first(capsys):
    with LabProgress("doctor") as bar:
        task = bar.add_task("", total=3)
        bar.update(task, description="base at 1 process(es), run 1")
        assert capsys.readouterr().err == ""  # input refused at the start stays the command's one line
        bar.advance(task)
        bar.update(task, description="phases at 2 process(es), run 1")
        bar.advance(task)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln]  # rich ends its display with a newline
    assert len(lines) == 2, lines
    assert re.fullmatch(r"doctor: 1/3 runs, \d+ s: base at 1 process\(es\), run 1 done; next: phases at 2 "
                        r"process\(es\), run 1", lines[0]), lines
    assert re.fullmatch(r"doctor: 2/3 runs, \d+ s: phases at 2 process\(es\), run 1 done", lines[1]), lines
