"""trainscale's door into an unmodified training script: Python imports this at start-up from ``PYTHONPATH``.

It runs the ``sitecustomize`` that this one shadows (if any), then, only when ``TRAINSCALE_INJECT`` asks and only
in a rank's main process (``RANK`` set by the launcher, and not a child such as a loader worker: the process id
is recorded in the environment by the first process that acts), waits for the script to import torch and
installs trainscale's hooks then (``trainscale.inject.agent``). Anything that goes wrong here is reported on
stderr and the script runs on uninstrumented: the user's job never fails because of it.
"""

import os
import sys


def _chain() -> None:
    """Import the next ``sitecustomize`` on the path, the one this file shadows."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _wanted() -> bool:
    """A rank's main process of a run that trainscale instruments."""
    if os.environ.get("TRAINSCALE_INJECT") != "1" or "RANK" not in os.environ:
        return False
    owner = os.environ.get("TRAINSCALE_INJECT_PID")
    if owner and owner != str(os.getpid()):
        return False  # a child of the rank (a spawned loader worker, a subprocess): never instrumented
    os.environ["TRAINSCALE_INJECT_PID"] = str(os.getpid())
    if hasattr(os, "sched_getaffinity"):  # before the script runs: a package it imports may narrow it
        os.environ["TRAINSCALE_START_CPUS"] = str(len(os.sched_getaffinity(0)))
    return True


class _TorchWatch:
    """A meta-path finder that lets torch load normally, then calls the agent once its import has finished."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 - the finder protocol
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):  # noqa: ANN001, ANN202
            original(module)
            _activate()

        loader.exec_module = exec_module
        return spec


def _activate() -> None:
    try:
        from trainscale.inject.agent import activate

        activate()
    except Exception as e:  # never the user's job's failure
        line = f"trainscale inject: not instrumented ({type(e).__name__}: {e})"
        sys.stderr.write(line + "\n")
        summary = os.environ.get("TRAINSCALE_JSON")
        if summary:  # the lab's one line for a run without a summary (jobs.run), instead of "use the run API"
            try:
                with open(summary + ".why", "w") as f:
                    f.write(line + "\n")
            except OSError:
                pass


try:
    _chain()
except Exception as e:  # the shadowed sitecustomize's own failure stays a warning, as Python's site does
    sys.stderr.write(f"trainscale inject: the sitecustomize it chains to failed ({type(e).__name__}: {e})\n")

if _wanted():
    if "torch" in sys.modules:
        _activate()
    else:
        sys.meta_path.insert(0, _TorchWatch())
