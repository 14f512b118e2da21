"""Where a stalled rank stands: its newest collective (PyTorch's Flight Recorder) and its place in the code.

The Flight Recorder keeps, per process, a ring of the last ``TORCH_FR_BUFFER_SIZE`` collectives with their
sequence number, op and shapes. On Gloo (torch 2.13) every entry stays "scheduled", since Gloo reports no
completion, so the newest entry is the collective a waiting rank waits in, or for a rank stopped elsewhere
the last one it entered. The watchdog reads both only when its rank has made no progress for a beat, so a
healthy run pays nothing but the recorder's own ring.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["BUFFER", "enable_flight_recorder", "newest_collective", "code_position", "describe", "mismatch"]

BUFFER = 64  # collectives kept per process (a step of DDP issues one per bucket)
RECENT = 8  # the newest collectives a stalled rank publishes: a rank that got through one the others did not
_OURS = str(Path(__file__).resolve().parents[1])  # trainscale's package
_STDLIB = os.path.dirname(os.__file__)


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
    frame = sys._current_frames().get(thread_id or threading.main_thread().ident or 0)
    ours = None
    while frame is not None:
        where = frame.f_code.co_filename
        if where.startswith(_OURS):
            ours = ours or frame
        elif not where.startswith(_STDLIB) and "-packages/" not in where and not where.startswith("<"):
            return _at(frame)
        frame = frame.f_back
    return _at(ours) if ours is not None else "unknown"


def _at(frame: Any) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def describe(coll: dict[str, Any] | None) -> str:
    """``collective #12 all_reduce [[1290]]``."""
    if not coll:
        return "no collective recorded"
    return f"collective #{coll['seq']} {coll['op']} {coll['sizes']}"


def mismatch(colls: dict[int, dict[str, Any] | None]) -> str:
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
