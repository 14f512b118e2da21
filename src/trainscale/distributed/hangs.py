"""Where a stalled or failed rank stands: its newest collective (PyTorch's Flight Recorder) and its place in the code.

The Flight Recorder keeps, per process, a ring of the last ``TORCH_FR_BUFFER_SIZE`` collectives with their
sequence number, op and shapes. On Gloo (torch 2.13) every entry stays "scheduled", since Gloo reports no
completion, so the newest entry is the collective a waiting rank waits in, or for a rank stopped elsewhere
the last one it entered. The watchdog reads both only when its rank has made no progress for a beat, so a
healthy run pays nothing but the recorder's own ring.

A rank that fails says the same in torchrun's error file (``at_failure``). A rank ended by a fatal signal runs
no Python: Gloo aborts the process when a peer sends another size than it expects (one rank skipped a
collective), so its threads' stacks go to a file beside the error file (``record_fatal_stacks``), from which
``trainscale launch`` reads the collective it waited in and where (``fatal_position``).
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..about import PACKAGE_DIR, user_code

__all__ = ["BUFFER", "enable_flight_recorder", "newest_collective", "code_position", "describe", "mismatch",
           "record_fatal_stacks", "FATAL_STACKS", "at_failure", "fatal_position"]

BUFFER = 64  # collectives kept per process (a step of DDP issues one per bucket)
RECENT = 8  # the newest collectives a stalled rank publishes: a rank that got through one the others did not
FATAL_STACKS = "fatal_stacks.txt"  # beside torchrun's error file of the rank
_C10D = "distributed_c10d.py"  # torch.distributed's collectives: the innermost frame there names the op
_fatal_file: list[Any] = []  # kept open for the life of the process: faulthandler writes to its descriptor


def enable_flight_recorder() -> None:
    """Turn the recorder on for the process groups made after this (the user's own setting wins)."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(BUFFER))


def newest_collective() -> dict[str, Any] | None:
    """The newest collective this process entered: ``{"seq", "op", "sizes"}``; None without the recorder."""
    if os.environ.get("TORCH_FR_BUFFER_SIZE", "0") in ("", "0"):
        return None
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]
        entries = json.loads(_dump_fr_trace_json(True, False)).get("entries") or []
    except Exception:  # no recorder in this build, or nothing recorded yet
        return None
    if not entries:
        return None
    e = max(entries, key=lambda x: x.get("record_id", 0))
    group = [x for x in entries if x.get("process_group") == e.get("process_group")]  # seq ids count per group
    recent = sorted(group, key=lambda x: x.get("record_id", 0))[-RECENT:]
    return {**_entry(e), "recent": [[x.get("collective_seq_id"), _entry(x)["op"], x.get("input_sizes")]
                                    for x in recent]}


def _entry(e: dict[str, Any]) -> dict[str, Any]:
    return {"seq": e.get("collective_seq_id"), "op": str(e.get("profiling_name", "?")).split(":")[-1],
            "sizes": e.get("input_sizes")}


def code_position(thread_id: int | None = None) -> str:
    """``file:line in function`` of the main thread: its innermost frame in the user's code, else in trainscale's."""
    return _position(_frames(sys._current_frames().get(thread_id or threading.main_thread().ident or 0)))


def _frames(frame: Any) -> list[tuple[str, int, str]]:
    """(file, line, function) from ``frame`` outwards."""
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out


def _position(frames: list[tuple[str, int, str]]) -> str:
    """The innermost of ``frames`` (innermost first) in the user's code, else in trainscale's."""
    ours = None
    for where, line, func in frames:
        if where.startswith(PACKAGE_DIR):
            ours = ours or (where, line, func)
        elif user_code(where):
            return f"{where}:{line} in {func}"
    return f"{ours[0]}:{ours[1]} in {ours[2]}" if ours else "unknown"


def record_fatal_stacks() -> None:
    """Under torchrun, a fatal signal (Gloo's abort, a segfault) writes this rank's Python stacks beside its error
    file, for ``trainscale launch`` to say where the rank stood (a faulthandler the user enabled is left alone)."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file or faulthandler.is_enabled():
        return
    try:
        path = Path(error_file).with_name(FATAL_STACKS)
        path.parent.mkdir(parents=True, exist_ok=True)
        _fatal_file.append(open(path, "w"))  # noqa: SIM115 (open until the process ends)
        faulthandler.enable(file=_fatal_file[-1], all_threads=True)
    except OSError:
        pass  # no stacks on a fatal signal: the launcher names the signal alone


def at_failure(tb: Any) -> dict[str, Any] | None:
    """What a rank that failed with the traceback ``tb`` was doing: its newest collective (with its recent ones)
    and where its code stood; None outside a distributed job with the recorder on."""
    import traceback

    coll = newest_collective()
    if coll is None:
        return None
    # The traceback's own line numbers: a frame's current line has moved on to the finally blocks run since.
    frames = [(s.filename, s.lineno or 0, s.name) for s in reversed(traceback.extract_tb(tb))]
    return {**coll, "at": _position(frames)}


_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (\S+)')


def fatal_position(dump: str) -> dict[str, str] | None:
    """From a faulthandler dump: the collective a thread stood in (``op``) and where in the code (``at``), for the
    first thread inside one of torch.distributed's collectives; None when no thread was."""
    for block in re.split(r"\n(?=\S)", dump):
        frames = [(m.group(1), int(m.group(2)), m.group(3)) for m in map(_FRAME.match, block.splitlines()) if m]
        ops = [func for where, _, func in frames if where.endswith(_C10D) and not func.startswith("_")]
        if ops:  # innermost first: the first public function of the module is the collective called
            return {"op": ops[0], "at": _position(frames)}
    return None


def describe(coll: dict[str, Any] | None) -> str:
    """``collective #12 all_reduce [[1290]]``."""
    if not coll:
        return "no collective recorded"
    return f"collective #{coll['seq']} {coll['op']} {coll['sizes']}"


def mismatch(colls: Mapping[int, dict[str, Any] | None]) -> str:
    """One line when two ranks entered the collective of the same number with another op or shapes, else ''.

    Each rank's newest collective and, where published, its ``recent`` ones: on Gloo a rank can get through a
    collective whose peer gave another shape and wait in the next one, while its peer still waits in the first.
    """
    by_seq: dict[Any, list[tuple[int, dict[str, Any]]]] = {}
    for rank, c in sorted(colls.items()):
        if not c:
            continue
        mine = {c["seq"]: c}
        for seq, op, sizes in c.get("recent") or []:
            mine.setdefault(seq, {"seq": seq, "op": op, "sizes": sizes})
        for seq, e in mine.items():
            by_seq.setdefault(seq, []).append((rank, e))
    for seq, ranks in sorted(by_seq.items(), key=lambda kv: (str(type(kv[0])), kv[0])):  # the oldest first
        if len({(c["op"], json.dumps(c["sizes"])) for _, c in ranks}) > 1:
            parts = ", ".join(f"rank {r} {c['op']} {c['sizes']}" for r, c in ranks)
            return f"mismatched collective #{seq}: {parts}"
    return ""
