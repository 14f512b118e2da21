"""``trainscale data``: pack an image folder into uint8 shards, describe (and verify) a pack."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import ConfigError

__all__ = ["main"]

EPILOG = """examples:
  trainscale data pack ~/imagenet/train /fast/imagenet-train-160 --size 160
  trainscale data info /fast/imagenet-train-160 --verify
  trainscale train --data packed --data.path /fast/imagenet-train-160 --data.image_size 128 --data.workers 4
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainscale data", description=__doc__.split("\n")[0].strip("`"),
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    sub = p.add_subparsers(dest="cmd", required=True)
    pk = sub.add_parser("pack", help="decode a class-per-folder image tree once into uint8 shards")
    pk.add_argument("src", help="image folder: SRC/CLASS/IMAGE.jpg")
    pk.add_argument("dst", help="new folder for the pack (must not exist or be empty)")
    pk.add_argument("--size", type=int, required=True,
                    help="side S of the stored images: shorter side resized to S, centre S x S kept")
    pk.add_argument("--shard-mb", type=float, default=256.0, help="bytes per shard file, in MiB (default 256)")
    pk.add_argument("--workers", type=int, default=0, help="decoding processes (default: all cores)")
    pk.add_argument("--on-error", choices=("skip", "raise"), default="skip",
                    help="an unreadable image: skip it with a warning (default) or stop")
    pk.add_argument("--decoder", choices=("auto", "opencv", "pillow"), default="auto")
    inf = sub.add_parser("info", help="describe a pack (or an image folder)")
    inf.add_argument("path")
    inf.add_argument("--verify", action="store_true", help="hash every shard against the pack's checksums")
    inf.add_argument("--json", action="store_true", help="print the description as one JSON object")
    return p


def _pack(args: argparse.Namespace) -> int:
    from ..log import setup_logging
    from .packed import pack_folder

    setup_logging("info", rank=0)
    if args.shard_mb <= 0:
        raise ConfigError("--shard-mb", args.shard_mb, "must be > 0")
    meta = pack_folder(args.src, args.dst, args.size, args.shard_mb, args.workers, args.on_error, args.decoder)
    total = sum(s["bytes"] for s in meta["shards"])
    print(f"packed {meta['records']:,} images of {len(meta['classes'])} classes into {len(meta['shards'])} shard(s), "
          f"{total / 2**20:.1f} MiB, {meta['size']}x{meta['size']} uint8, in {meta['pack_s']:.1f} s"
          + (f"; skipped {meta['skipped']} unreadable" if meta["skipped"] else "") + f" -> {args.dst}")
    return 0


def _info(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not (path / "pack.json").is_file() and path.is_dir():
        from .imagefolder import scan_folder
        paths, labels, classes = scan_folder(args.path, "PATH")
        desc = {"kind": "imagefolder", "path": str(path), "images": len(paths), "classes": len(classes),
                "class_names": classes[:20]}
        print(json.dumps(desc) if args.json else
              f"image folder {path}: {len(paths):,} images, {len(classes)} classes "
              f"({', '.join(classes[:8])}{', ...' if len(classes) > 8 else ''})")
        return 0
    from .packed import Pack

    pack = Pack(args.path, "PATH")
    m = pack.meta
    total = sum(s["bytes"] for s in m["shards"])
    desc = {"kind": "pack", "path": str(path), "records": m["records"], "classes": len(m["classes"]),
            "size": m["size"], "layout": m["layout"], "shards": len(m["shards"]), "bytes": total,
            "skipped": m["skipped"], "source": m["source"], "decoder": m.get("decoder")}
    bad: list[str] = []
    if args.verify:
        bad = pack.verify()
        desc["verified"] = not bad
    if args.json:
        print(json.dumps(desc))
    else:
        print(f"pack {path}: {m['records']:,} images, {len(m['classes'])} classes, {m['size']}x{m['size']}x3 uint8 "
              f"({m['layout']}), {len(m['shards'])} shard(s), {total / 2**20:.1f} MiB, from {m['source']}"
              + (f", {m['skipped']} unreadable skipped" if m["skipped"] else ""))
        if args.verify and not bad:
            print("verify: every shard matches its SHA-256")
    if bad:
        print(f"trainscale data: {path}: altered or corrupt: {', '.join(bad)}; re-pack it", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    """Entry of ``trainscale data``."""
    args = _parser().parse_args(argv)
    return _pack(args) if args.cmd == "pack" else _info(args)
