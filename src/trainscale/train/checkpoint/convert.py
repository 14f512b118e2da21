"""``trainscale checkpoint convert SRC DST``: a one-file checkpoint (``.pt``) to a sharded DCP folder, and back.

The two formats hold the same things in different layouts. ``.pt`` is rank 0's nested dict: the model's
state_dict, the optimizer's full state_dict (parameters by index), every rank's RNG as Python values and the
run's counters. DCP is flat and holds tensors only: ``model/NAME``, ``optim/NAME/KEY``, ``rng/RANK/...`` and
``meta`` (the counters as JSON bytes); see :mod:`.dcp`. Converting maps one layout onto the other on the CPU,
without a process group. DCP's own ``format_utils`` keeps a state's layout as it is, and its
``torch_save_to_dcp`` unpickles with ``weights_only=False``, so it is not used: here neither direction
unpickles arbitrary objects. The destination is written under a temporary name beside it and renamed once
complete, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

from ...config import ConfigError
from ...reporting.files import atomic_write_bytes
from .dcp import meta_tensor, read_all, rng_from_tensors, rng_tensors
from .files import is_sharded, load_checkpoint

__all__ = ["convert_checkpoint", "pt_to_flat", "flat_to_pt", "main"]

_NESTED = ("model", "optimizer", "rng")  # the .pt keys that are not the run's counters
_NO_NAMES = ("its optimizer state cannot be matched to parameter names (no param_names: written before trainscale "
             "recorded them); resume from it once and save again")


def _names_by_index(meta: dict[str, Any], groups: list[dict[str, Any]], model_keys: list[str]) -> dict[int, str]:
    """Optimizer parameter index -> parameter name, from the ``param_names`` the run recorded."""
    names = meta.get("param_names")
    sizes = [len(g["params"]) for g in groups]
    if names is None and sum(sizes) == len(model_keys):  # older checkpoints: a model without buffers maps 1:1
        names, i = [], 0
        for n in sizes:
            names.append(model_keys[i:i + n])
            i += n
    if names is None or [len(n) for n in names] != sizes:
        raise ValueError(_NO_NAMES)
    return {idx: name for g, gnames in zip(groups, names) for idx, name in zip(g["params"], gnames)}


def pt_to_flat(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A ``.pt`` checkpoint's dict as DCP's flat tensors (the layout :func:`.dcp.build_state` writes); ValueError
    where it does not map."""
    meta = {k: v for k, v in state.items() if k not in _NESTED}
    flat: dict[str, torch.Tensor] = {f"model/{k}": v for k, v in state["model"].items()}
    opt = state.get("optimizer") or {}
    if opt.get("param_groups"):
        by_index = _names_by_index(meta, opt["param_groups"], list(state["model"]))
        for idx, s in opt.get("state", {}).items():
            for k, v in s.items():
                flat[f"optim/{by_index[int(idx)]}/{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
        meta["param_groups"] = [{k: v for k, v in g.items() if k != "params"} for g in opt["param_groups"]]
    for rank, rs in enumerate(state.get("rng") or []):
        flat.update(rng_tensors(rs, rank))
    try:
        flat["meta"] = meta_tensor(meta)
    except TypeError as e:
        raise ValueError(f"holds counters that JSON cannot carry ({e})") from None
    return flat


def flat_to_pt(flat: dict[str, torch.Tensor]) -> dict[str, Any]:
    """DCP's flat tensors as a ``.pt`` checkpoint's dict (optimizer state by index, RNG per rank)."""
    meta = json.loads(flat["meta"].numpy().tobytes().decode())
    model = {k[len("model/"):]: v for k, v in flat.items() if k.startswith("model/")}
    optimizer: dict[str, Any] = {}
    groups = meta.pop("param_groups", None)
    if groups is not None:
        optim = [k.split("/", 2)[1:] for k in flat if k.startswith("optim/")]
        names = meta.get("param_names") or ([list(model)] if len(groups) == 1 and {n for n, _ in optim} == set(model)
                                            else None)
        if names is None or len(names) != len(groups):
            raise ValueError(_NO_NAMES)
        index = {name: i for i, name in enumerate(n for g in names for n in g)}
        state: dict[int, dict[str, Any]] = {}
        for name, key in optim:
            state.setdefault(index[name], {})[key] = flat[f"optim/{name}/{key}"]
        first = 0
        param_groups = []
        for g, gnames in zip(groups, names):
            param_groups.append({**g, "params": list(range(first, first + len(gnames)))})
            first += len(gnames)
        optimizer = {"state": dict(sorted(state.items())), "param_groups": param_groups}
    ranks = sorted(int(k.split("/")[1]) for k in flat if k.startswith("rng/") and k.endswith("/torch"))
    return {"model": model, "optimizer": optimizer, "rng": [rng_from_tensors(flat, r) for r in ranks], **meta}


def _temp_beside(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp"


def convert_checkpoint(src: str | Path, dst: str | Path) -> dict[str, Any]:
    """Convert ``src`` (``step_N.pt`` or a sharded ``step_N/`` folder) into the other format at ``dst``.

    Returns ``{"src", "dst", "to", "step", "bytes"}``. ``dst`` must not exist; it appears only when complete.

    Example::

        convert_checkpoint("ck/step_100", "ck-single/step_100.pt")   # sharded -> one file
        convert_checkpoint("ck-single/step_100.pt", "ck2/step_100")  # one file -> sharded
    """
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise ConfigError("SRC", str(src), "no such file or folder; give a step_N.pt file or a sharded step_N/ folder")
    if dst.exists():
        raise ConfigError("DST", str(dst), "already exists; remove it or give a new name")
    sharded = is_sharded(src)
    if src.is_dir() and not sharded:
        raise ConfigError("SRC", str(src), "a folder without DCP's .metadata: not a sharded checkpoint (a checkpoint "
                          "folder's newest is the one its `latest` file names)")
    if sharded and dst.suffix != ".pt":
        raise ConfigError("DST", str(dst), "SRC is sharded, so DST is one file: give a name ending in .pt")
    if not sharded and dst.suffix == ".pt":
        raise ConfigError("DST", str(dst), "SRC is one file, so DST is a sharded folder: give a name without .pt")
    try:
        if sharded:
            try:
                flat = read_all(src)
            except Exception as e:
                raise ConfigError("SRC", str(src), f"not a readable sharded checkpoint: {e}") from None
            if "meta" not in flat:
                raise ConfigError("SRC", str(src), "not a trainscale checkpoint (no meta)")
            state = flat_to_pt(flat)
            atomic_write_bytes(dst, lambda f: torch.save(state, f))
            size = dst.stat().st_size
        else:
            try:
                state = load_checkpoint(src)
            except ConfigError as e:
                raise ConfigError("SRC", str(src), e.accepted) from None
            _write_sharded(pt_to_flat(state), dst)
            size = sum(p.stat().st_size for p in dst.iterdir())
    except ConfigError:
        raise
    except ValueError as e:  # the content does not map onto the other layout
        raise ConfigError("SRC", str(src), str(e)) from None
    except OSError as e:
        raise ConfigError("DST", str(dst), f"cannot be written ({e}); nothing was left behind") from None
    return {"src": str(src), "dst": str(dst), "to": "pt" if sharded else "dcp", "step": state["step"], "bytes": size}


def _write_sharded(flat: dict[str, torch.Tensor], dst: Path) -> None:
    """DCP without a process group into a temporary folder beside ``dst``, renamed to ``dst`` when complete."""
    import torch.distributed.checkpoint as dcp

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(dst)
    try:
        dcp.save(flat, checkpoint_id=str(tmp), no_dist=True)
        os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainscale checkpoint", description="Work with trainscale's checkpoints.")
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = sub.add_parser(
        "convert", help="one .pt file -> a sharded DCP folder, or a sharded folder -> one .pt file",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Convert a checkpoint between the two formats trainscale writes: one file (step_N.pt, "
                    "--checkpoint.format file) and a torch.distributed.checkpoint folder (step_N/, "
                    "--checkpoint.format dcp). The direction follows SRC; --resume takes either result.",
        epilog="examples:\n"
               "  trainscale checkpoint convert ck/step_100 single/step_100.pt   # sharded -> one file\n"
               "  trainscale checkpoint convert ck/step_100.pt sharded/step_100  # one file -> sharded\n"
               "  trainscale train --resume single/step_100.pt ...               # resume from either")
    c.add_argument("src", metavar="SRC", help="a step_N.pt file or a sharded step_N/ folder (with .metadata)")
    c.add_argument("dst", metavar="DST", help="where the other format goes (must not exist): NAME.pt from a "
                                              "folder, a folder name from a .pt file")
    return p


def main(argv: list[str]) -> int:
    """Entry of ``trainscale checkpoint``."""
    args = _parser().parse_args(argv)
    r = convert_checkpoint(args.src, args.dst)
    kind = "one file" if r["to"] == "pt" else "sharded folder"
    print(f"trainscale checkpoint: {r['src']} -> {r['dst']} ({kind}, step {r['step']}, {r['bytes']:,} bytes)")
    return 0
