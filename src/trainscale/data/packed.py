"""Packed shards: an image folder decoded once into fixed-size uint8 records, read back by memory map.

Layout of a pack folder::

    pack.json         format, image side, classes, shards (file, records, bytes, sha256), source
    index.npy         int64 [N, 2]: label and CRC-32 of every record
    shard_00000.bin   records of ``size x size x 3`` uint8 (HWC), back to back, no header

A record is read as a view of the mapped file (no Python object per sample, nothing copied into
workers). A shard whose length disagrees with the index is refused when the pack is opened; a record
whose CRC-32 disagrees is refused when it is read (checked once per process), so altered bytes are
an error, never silently trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import zlib
from collections.abc import Iterator, Sequence
from multiprocessing import get_context
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch.utils.data import Dataset

from ..config import ConfigError
from ..log import logger
from .decode import DecodeError, center_box, load_crop, random_box, resized_crop, resolve_decoder
from .imagefolder import Batch, _stack, sample_rng, scan_folder

__all__ = ["pack_folder", "Pack", "PackedImages", "PackError"]

FORMAT, VERSION = "trainscale-pack", 1


class PackError(ConfigError):
    """A pack that cannot be read as written (missing, truncated or altered); names the file."""

    def __init__(self, path: str | Path, why: str):
        super().__init__("data.path", str(path), why + "; re-pack with `trainscale data pack SRC DST --size S`")


def _decode_one(job: tuple[str, int, str]) -> tuple[bytes | None, str]:
    path, size, decoder = job
    try:
        return load_crop(path, decoder, size, None, frac=1.0).tobytes(), ""
    except (DecodeError, OSError) as e:
        return None, str(e)


def _records(paths: np.ndarray, size: int, decoder: str, workers: int) -> Iterator[tuple[bytes | None, str]]:
    jobs = ((p.decode(), size, decoder) for p in paths)
    if workers <= 1:
        yield from map(_decode_one, jobs)
        return
    with get_context("fork").Pool(workers) as pool:
        yield from pool.imap(_decode_one, jobs, chunksize=16)


def pack_folder(src: str, dst: str, size: int, shard_mb: float = 256.0, workers: int = 0,
                on_error: str = "skip", decoder: str = "auto") -> dict[str, Any]:
    """Decode every image of ``src`` once into ``size x size`` uint8 records under ``dst``; returns pack.json.

    Written into a temporary sibling folder and renamed at the end: an interrupted pack leaves nothing.
    """
    if size < 8:
        raise ConfigError("--size", size, "image side in pixels, at least 8")
    out = Path(dst)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError("DST", dst, "already exists and is not empty; choose a new folder")
    paths, labels, classes = scan_folder(src, "SRC")
    decoder = resolve_decoder(decoder)
    workers = workers or (os.cpu_count() or 1)
    rec_bytes = size * size * 3
    per_shard = max(1, int(shard_mb * 2**20) // rec_bytes)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        writer = _ShardWriter(tmp, per_shard, rec_bytes)
        index, skipped = _write_records(writer, paths, labels, _records(paths, size, decoder, workers), on_error)
        if not index:
            raise ConfigError("SRC", src, "no readable image: nothing to pack")
        np.save(tmp / "index.npy", np.array(index, dtype=np.int64))
        meta = {"format": FORMAT, "version": VERSION, "size": size, "channels": 3, "layout": "HWC",
                "records": len(index), "per_shard": per_shard, "record_bytes": rec_bytes, "classes": classes,
                "source": str(Path(src).resolve()), "skipped": len(skipped), "skipped_files": skipped[:100],
                "decoder": decoder, "shards": writer.shards,
                "index_sha256": hashlib.sha256((tmp / "index.npy").read_bytes()).hexdigest(),
                "pack_s": round(time.perf_counter() - t0, 2)}
        (tmp / "pack.json").write_text(json.dumps(meta, indent=2) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


def _write_records(writer: _ShardWriter, paths: np.ndarray, labels: np.ndarray,
                   records: Iterator[tuple[bytes | None, str]], on_error: str
                   ) -> tuple[list[tuple[int, int]], list[str]]:
    """Write each decoded record in order; (label and CRC-32 of each one written, the files skipped)."""
    index: list[tuple[int, int]] = []
    skipped: list[str] = []
    try:
        for i, (rec, why) in enumerate(records):
            if rec is None:
                name = paths[i].decode()
                if on_error == "raise":
                    raise ConfigError("SRC", name, f"unreadable image ({why}); --on-error skip leaves such files out")
                logger.warning(f"skipped unreadable image {name}: {why}")
                skipped.append(name)
                continue
            writer.write(rec)
            index.append((int(labels[i]), zlib.crc32(rec)))
    finally:
        writer.close()
    return index, skipped


class _ShardWriter:
    """Appends records to shard files of ``per_shard`` records each, noting each shard's length and SHA-256."""

    def __init__(self, folder: Path, per_shard: int, rec_bytes: int):
        self.folder, self.per_shard, self.rec_bytes = folder, per_shard, rec_bytes
        self.shards: list[dict[str, Any]] = []
        self._file: BinaryIO | None = None
        self._hash = hashlib.sha256()
        self._count = 0

    def write(self, rec: bytes) -> None:
        """Append one record, opening the next shard first and closing it once full."""
        if self._file is None:
            name = f"shard_{len(self.shards):05d}.bin"
            self._file, self._hash, self._count = open(self.folder / name, "wb"), hashlib.sha256(), 0
            self.shards.append({"file": name})
        self._file.write(rec)
        self._hash.update(rec)
        self._count += 1
        if self._count == self.per_shard:
            self.close()

    def close(self) -> None:
        """Close the open shard, if any, with its record count, bytes and SHA-256."""
        if self._file is None:
            return
        self.shards[-1].update(records=self._count, bytes=self._count * self.rec_bytes, sha256=self._hash.hexdigest())
        self._file.close()
        self._file = None


class Pack:
    """An opened pack: metadata, labels, and a cheap check that every shard has its full length."""

    def __init__(self, path: str, key: str = "data.path"):
        self.path = Path(path)
        meta_file = self.path / "pack.json"
        if not path or not meta_file.is_file():
            raise ConfigError(key, path, "not a trainscale pack (no pack.json); make one with "
                                         "`trainscale data pack SRC DST --size S`")
        try:
            self.meta = json.loads(meta_file.read_text())
        except json.JSONDecodeError as e:
            raise PackError(meta_file, f"pack.json is not valid JSON ({e})") from None
        if self.meta.get("format") != FORMAT or self.meta.get("version") != VERSION:
            raise PackError(meta_file, f"not a {FORMAT} v{VERSION} file")
        self.size, self.rec_bytes = int(self.meta["size"]), int(self.meta["record_bytes"])
        self.per_shard, self.shards = int(self.meta["per_shard"]), self.meta["shards"]
        for s in self.shards:
            f = self.path / s["file"]
            if not f.is_file():
                raise PackError(f, "shard file is missing")
            if f.stat().st_size != s["bytes"]:
                raise PackError(f, f"truncated or altered shard: {f.stat().st_size} bytes, the index says {s['bytes']}")
        try:
            index = np.load(self.path / "index.npy")
        except (OSError, ValueError) as e:
            raise PackError(self.path / "index.npy", f"unreadable index ({e})") from None
        if index.shape != (int(self.meta["records"]), 2):
            raise PackError(self.path / "index.npy", f"index has shape {index.shape}, expected "
                                                     f"({self.meta['records']}, 2)")
        self.labels, self.crc = index[:, 0].copy(), index[:, 1].astype(np.uint32)

    def __len__(self) -> int:
        return len(self.labels)

    def verify(self) -> list[str]:
        """Hash every shard against pack.json; the files that do not match (empty list: all good)."""
        bad = []
        for s in self.shards:
            h = hashlib.sha256()
            with open(self.path / s["file"], "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
            if h.hexdigest() != s["sha256"]:
                bad.append(s["file"])
        if hashlib.sha256((self.path / "index.npy").read_bytes()).hexdigest() != self.meta.get("index_sha256"):
            bad.append("index.npy")
        return bad


class PackedImages(Dataset):
    """A pack as a dataset of ``size x size`` uint8 crops (random-resized + flip when ``train``)."""

    def __init__(self, path: str, size: int, train: bool, decoder: str, key: str = "data.path"):
        self.pack = Pack(path, key)
        self.size, self.train, self.decoder = size, train, decoder
        self.labels = torch.from_numpy(self.pack.labels)
        self.classes: list[str] = list(self.pack.meta["classes"])
        self._maps: dict[int, np.memmap] = {}
        self._verified: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Maps are opened in each process that reads, never pickled (a pickled memmap is a full copy).
        return {**self.__dict__, "_maps": {}, "_verified": None}

    def __len__(self) -> int:
        return len(self.pack)

    def record(self, i: int) -> np.ndarray:
        """Record ``i`` as a ``size x size x 3`` uint8 view of the mapped shard; its CRC checked once per process."""
        p = self.pack
        s, j = divmod(i, p.per_shard)
        m = self._maps.get(s)
        if m is None:
            m = self._maps[s] = np.memmap(p.path / p.shards[s]["file"], dtype=np.uint8, mode="r")
        rec = m[j * p.rec_bytes:(j + 1) * p.rec_bytes]
        if self._verified is None:
            self._verified = np.zeros(len(p), dtype=bool)
        if not self._verified[i]:
            if zlib.crc32(rec.data) != p.crc[i]:  # .data: the record's bytes, no copy
                raise PackError(p.path / p.shards[s]["file"], f"record {j} (sample {i}) fails its CRC-32: "
                                                              "the shard was altered")
            self._verified[i] = True
        return rec.reshape(p.size, p.size, 3)

    def get_batch(self, indices: Sequence[int], epoch: int, seed: int = 0) -> Batch:
        """Crop a batch for ``epoch``; a record failing its checksum is reported as fatal."""
        imgs, keep, errors = [], [], []
        s = self.pack.size
        for i in indices:
            try:
                rec = self.record(i)
            except PackError as e:
                errors.append((str(e.value), str(e.accepted), True))
                continue
            if self.train:
                rng = sample_rng(seed, epoch, i)
                box, flip = random_box(s, s, rng), bool(rng.integers(0, 2))
            else:
                box, flip = center_box(s, s, 1.0), False
            imgs.append(resized_crop(rec, box, self.size, flip, self.decoder))
            keep.append(i)
        return _stack(imgs, self.size), self.labels[torch.as_tensor(keep, dtype=torch.long)], errors

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(t[0] for t in self.__getitems__([i]))  # type: ignore[return-value]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, errors = self.get_batch(indices, 0, 0)
        if errors:
            raise PackError(errors[0][0], errors[0][1].split("; re-pack")[0])
        return x, y
