"""The ``trainscale`` command: one subcommand per layer, each in its own module.

Every subcommand module exposes ``main(argv: list[str]) -> int``; this file only dispatches, and turns
a configuration error into one clear line and exit status 2.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import sys

from .config import ConfigError

__all__ = ["main"]

SUBCOMMANDS = {
    "launch": ("trainscale.distributed.cli", "run any torchrun script on N processes (a wrapper over torchrun)"),
    "train": ("trainscale.train.cli", "train a model with synchronous data parallelism"),
    "checkpoint": ("trainscale.train.checkpoint.convert", "convert a checkpoint between one .pt file and a sharded DCP folder"),
    "data": ("trainscale.data.cli", "pack an image folder into shards, describe a pack"),
    "bench": ("trainscale.lab.bench", "scaling sweep over world sizes, with a report"),
    "doctor": ("trainscale.lab.doctor", "controlled experiments that name why a job does not scale"),
    "ps": ("trainscale.ps.cli", "parameter-server training on Ray"),
    "plan": ("trainscale.sim.cli", "forecast speed-up on a cluster before paying for it"),
    "env": ("trainscale.about", "versions, devices, cores, threads and /dev/shm of this machine, for bug reports"),
}

USAGE = "usage: trainscale COMMAND [ARGS...]\n\ncommands:\n" + "\n".join(
    f"  {name:<10} {doc}" for name, (_, doc) in SUBCOMMANDS.items()) + "\n\n'trainscale COMMAND --help' explains each."


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    if argv is None:  # this process is the command (not a caller's): its exit may skip the last collection
        # Registered first, so it runs after every later handler (the process groups' ordered end among them):
        # with torch loaded, the interpreter's final collection of objects nothing uses any more takes ~0.6 s
        # per process, and a job launch pays it in the launcher and in every rank.
        atexit.register(gc.freeze)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name in ("-V", "--version"):
        from .about import __version__
        print(f"trainscale {__version__}")
        return 0
    if name not in SUBCOMMANDS:
        print(f"trainscale: unknown command {name!r}; commands are {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    module_name = SUBCOMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            print(f"trainscale {name}: not available in this version", file=sys.stderr)
            return 2
        raise
    try:
        return int(module.main(rest) or 0)
    except ConfigError as e:
        print(f"trainscale {name}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"trainscale {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
