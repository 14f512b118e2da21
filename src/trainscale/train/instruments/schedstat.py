"""The kernel's per-thread scheduler accounting: on-CPU time and run-queue wait of a rank's threads.

``/proc/<pid>/task/<tid>/schedstat`` holds three numbers: nanoseconds on a CPU, nanoseconds runnable but
waiting on a run queue, and time slices run (Linux ``Documentation/scheduler/sched-stats.rst``). Both sums
grow monotonically, so the difference of two readings is what the thread did in between. A descriptor
is opened once per thread and read with ``os.pread`` (about 4 us a read on the 2-core development VM,
``benchmarks/results/2026-11-25-doctor-accounting.md``), so a reading costs no path lookup.

Threads are sorted into the classes the run summary reports (``THREAD_CLASSES``):

- ``main``: the thread that runs the steps (the process's main thread, tid == pid, in a normal script);
- ``loader``: trainscale's prefetch thread(s) (named ``trainscale.data.loader.PREFETCH_THREAD``);
- ``other``: every other thread started from Python: the watchdog's heartbeat, a tracker's writer, an
  asynchronous checkpoint;
- ``backend``: the threads Python does not know: Gloo's or NCCL's, the intra-op (OpenMP) pool, autograd's.
  On CPU builds the intra-op pool's threads inherit the name ``python`` and Gloo's own names vary with the
  release, so names cannot split them reliably: they are one class;
- ``workers``: every thread of the DataLoader worker processes (children of the training thread).
"""

from __future__ import annotations

import contextlib
import os
import threading

from ...data.loader import PREFETCH_THREAD

__all__ = ["THREAD_CLASSES", "TaskStat", "ThreadSet", "available", "classify_thread", "read_schedstat",
           "worker_pids"]

THREAD_CLASSES = ("main", "backend", "loader", "workers", "other")


def read_schedstat(fd: int) -> tuple[int, int]:
    """(on-CPU ns, run-queue wait ns) from an open schedstat descriptor; raises OSError once the thread is gone."""
    fields = os.pread(fd, 96, 0).split()
    if len(fields) < 2:
        raise OSError("schedstat: empty read (the thread has exited)")
    return int(fields[0]), int(fields[1])


def available() -> str | None:
    """None when this thread's schedstat can be read; else why not (one line)."""
    path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
    try:
        with open(path, "rb") as f:
            if len(f.read().split()) >= 2:
                return None
            return f"{path} has fewer than 2 fields"
    except OSError as e:
        return f"{path} is not readable ({e.strerror}): not Linux, or a kernel without CONFIG_SCHED_INFO"


class TaskStat:
    """One thread's schedstat, open for repeated reads; ``delta()`` gives what it did since the last call."""

    __slots__ = ("fd", "cls", "cpu", "runq")

    def __init__(self, path: str, cls: str, baseline: bool):
        self.fd = os.open(path, os.O_RDONLY)
        self.cls = cls
        # A thread found after the first scan was born since the previous one: all of its time is new.
        self.cpu, self.runq = read_schedstat(self.fd) if baseline else (0, 0)

    def delta(self) -> tuple[int, int]:
        """(on-CPU ns, run-queue ns) since the previous reading."""
        cpu, runq = read_schedstat(self.fd)
        d = (cpu - self.cpu, runq - self.runq)
        self.cpu, self.runq = cpu, runq
        return d

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def classify_thread(tid: int, main_tid: int, python_threads: dict[int, str]) -> str:
    """The class of thread ``tid`` of this process; ``python_threads``: native id -> name of Python's threads."""
    if tid == main_tid:
        return "main"
    name = python_threads.get(tid)
    if name is None:
        return "backend"
    return "loader" if name.startswith(PREFETCH_THREAD) else "other"


def worker_pids(children_fd: int) -> list[int]:
    """Child processes listed by an open ``/proc/<pid>/task/<tid>/children`` (DataLoader forks its workers from
    the training thread)."""
    try:
        return [int(p) for p in os.pread(children_fd, 65536, 0).split()]
    except OSError:
        return []


def _task_ids(dir_fd: int) -> list[int]:
    """The thread ids in an open ``/proc/<pid>/task`` (none once the process has exited)."""
    try:
        return [int(t) for t in os.listdir(dir_fd)]
    except OSError:
        return []


class ThreadSet:
    """This process's threads other than the training thread, and its worker processes' threads.

    ``rescan`` updates the set (cheap enough per block of steps, not per step); ``read`` returns each class's
    (on-CPU ns, run-queue ns) since the previous ``read``. A thread that exits between two reads takes its
    last slice with it (its descriptor then reads nothing).
    """

    def __init__(self, main_tid: int):
        self.pid, self.main_tid = os.getpid(), main_tid
        self.tasks: dict[tuple[int, int], TaskStat] = {}
        self.counts = dict.fromkeys(THREAD_CLASSES, 0)  # the most threads of each class seen in one scan
        self.counts["main"] = 1
        self._scanned = False
        # Open once: a listing through a kept descriptor costs half a fresh path's lookup.
        self._dirs = {self.pid: os.open(f"/proc/{self.pid}/task", os.O_RDONLY)}
        self._children = os.open(f"/proc/{self.pid}/task/{main_tid}/children", os.O_RDONLY)

    def rescan(self) -> None:
        """Open the threads that appeared since the last scan, close those that are gone."""
        python = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        found: dict[tuple[int, int], str] = {}
        for tid in _task_ids(self._dirs[self.pid]):
            if tid != self.main_tid:
                found[(self.pid, tid)] = classify_thread(tid, self.main_tid, python)
        children = worker_pids(self._children)
        for child in children:
            with contextlib.suppress(OSError):
                if child not in self._dirs:
                    self._dirs[child] = os.open(f"/proc/{child}/task", os.O_RDONLY)
                for tid in _task_ids(self._dirs[child]):
                    found[(child, tid)] = "workers"
        for child in [c for c in self._dirs if c != self.pid and c not in children]:
            os.close(self._dirs.pop(child))
        for key in [k for k in self.tasks if k not in found]:
            self.tasks.pop(key).close()
        for key, cls in found.items():
            if key not in self.tasks:
                with contextlib.suppress(OSError):  # gone between the listing and the open
                    self.tasks[key] = TaskStat(f"/proc/{key[0]}/task/{key[1]}/schedstat", cls, not self._scanned)
        self._scanned = True
        for cls in THREAD_CLASSES[1:]:
            self.counts[cls] = max(self.counts[cls], sum(t.cls == cls for t in self.tasks.values()))

    def read(self) -> dict[str, tuple[int, int]]:
        """Per class (not ``main``): (on-CPU ns, run-queue ns) since the previous read."""
        cpu, runq = dict.fromkeys(THREAD_CLASSES[1:], 0), dict.fromkeys(THREAD_CLASSES[1:], 0)
        gone = []
        for key, task in self.tasks.items():
            try:
                c, r = task.delta()
            except OSError:
                gone.append(key)
                continue
            cpu[task.cls] += c
            runq[task.cls] += r
        for key in gone:
            self.tasks.pop(key).close()
        return {cls: (cpu[cls], runq[cls]) for cls in cpu}

    def close(self) -> None:
        for task in self.tasks.values():
            task.close()
        self.tasks.clear()
        for fd in [*self._dirs.values(), self._children]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._dirs.clear()
