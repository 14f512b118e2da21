"""Packs (round trip, checksums, info) and bad input: corrupt images, truncated/altered shards, empty folders."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from imgutil import FAST, make_folder, run_cli

from trainscale.config import ConfigError, DataConfig
from trainscale.data import DataInfo, TensorImages, TrainLoader, build_datasets, data_wait_advice, startup_warnings
from trainscale.data.decode import load_crop
from trainscale.data.packed import Pack, PackedImages

CPU = torch.device("cpu")


@pytest.fixture
def folder(tmp_path):
    return make_folder(tmp_path / "img")


def _pack(folder, dst, *extra):
    r = run_cli(["data", "pack", str(folder), str(dst), "--size", "24", "--workers", "1", *extra], timeout=60)
    assert r.rc == 0, r.text
    return r


def test_pack_round_trip_and_info(folder, tmp_path):
    dst = tmp_path / "pack"
    r = _pack(folder, dst, "--shard-mb", "0.01", "--decoder", "pillow")  # 6 records per shard: 7 shards
    assert "packed 42 images of 3 classes" in r.out
    pack = Pack(str(dst))
    assert len(pack) == 42 and len(pack.shards) == 7 and pack.verify() == []
    ds = PackedImages(str(dst), 24, train=False, decoder="pillow")
    assert not any(isinstance(v, list) and len(v) > 100 for v in vars(ds).values())
    # A record is the image's centre square, exactly as decoding it again gives.
    src = sorted((folder / "c1").glob("*.jpg"))[3]
    want = load_crop(str(src), "pillow", 24, None, frac=1.0)
    assert np.array_equal(ds.record(14 + 3), want)
    assert ds.labels[17] == 1
    info = run_cli(["data", "info", str(dst), "--verify", "--json"], timeout=60)
    assert info.rc == 0, info.text
    d = json.loads(info.out.strip().splitlines()[-1])
    assert (d["records"], d["classes"], d["size"], d["shards"], d["verified"]) == (42, 3, 24, 7, True)


def test_truncated_shard_is_a_clear_error(folder, tmp_path):
    dst = tmp_path / "pack"
    _pack(folder, dst)
    shard = dst / "shard_00000.bin"
    shard.write_bytes(shard.read_bytes()[:-100])
    r = run_cli(["train", "--data", "packed", "--data.path", str(dst), "--steps", "2", *FAST], timeout=60)
    assert r.rc == 2
    assert "shard_00000.bin" in r.err and "truncated" in r.err and "re-pack" in r.err
    assert len(r.err.strip().splitlines()) == 1
    assert run_cli(["data", "info", str(dst)], timeout=60).rc == 2


def test_altered_shard_is_refused_when_read(folder, tmp_path):
    dst = tmp_path / "pack"
    _pack(folder, dst)
    shard = dst / "shard_00000.bin"
    raw = bytearray(shard.read_bytes())
    raw[24 * 24 * 3 * 5 + 17] ^= 0xFF  # one byte of record 5, same length
    shard.write_bytes(bytes(raw))
    r = run_cli(["data", "info", str(dst), "--verify"], timeout=60)
    assert r.rc == 1 and "shard_00000.bin" in r.err
    train, _, info = build_datasets(DataConfig(name="packed", path=str(dst), image_size=16))
    loader = TrainLoader(train, info, CPU, 42, workers=1, prefetch=1)
    with pytest.raises(ConfigError, match=r"record 5 \(sample 5\) fails its CRC-32"):
        next(loader)
    loader.close()


def _corrupt(folder):
    bad = folder / "c1" / "zz_bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    return bad


def test_corrupt_image_skipped_with_warning_and_count(folder, tmp_path, caplog):
    _corrupt(folder)
    train, _, info = build_datasets(DataConfig(name="imagefolder", path=str(folder), image_size=16))
    loader = TrainLoader(train, info, CPU, 43, workers=1, prefetch=2, shuffle=False)
    x, y = next(loader)
    assert len(y) == 42 and loader.skipped == 1  # 43 files, one unreadable
    loader.close()
    json_path = tmp_path / "s.json"
    r = run_cli(["train", "--data", "imagefolder", "--data.path", str(folder), "--data.image_size", "8",
                 "--batch-size", "43", "--steps", "2", "--json", str(json_path), *FAST], timeout=120)
    assert r.rc == 0, r.text
    assert "skipped unreadable image" in r.err and "zz_bad.jpg" in r.err
    assert json.loads(json_path.read_text())["data_skipped"] == 2  # once per epoch


def test_corrupt_image_raise_names_the_file(folder):
    bad = _corrupt(folder)
    r = run_cli(["train", "--data", "imagefolder", "--data.path", str(folder), "--data.image_size", "8",
                 "--data.on_error", "raise", "--data.workers", "1", "--batch-size", "43", "--steps", "2", *FAST],
                timeout=120)
    assert r.rc == 2
    last = r.err.strip().splitlines()[-1]  # after the environment table: one line, no traceback
    assert str(bad) in last and "data.on_error = skip" in last and "Traceback" not in r.err


@pytest.mark.parametrize("case", ["empty", "empty_class", "missing", "no_path"])
def test_unusable_folders_are_clear_errors(tmp_path, case):
    from trainscale.data import check_data
    from trainscale.data.cli import main as data_main

    root = tmp_path / "img"
    if case == "empty":
        root.mkdir()
    elif case == "empty_class":
        make_folder(root, classes=2, per_class=2)
        (root / "c9").mkdir()
    want = {"empty": "has no class folders", "empty_class": "c9", "missing": "no such folder",
            "no_path": "needs a folder"}[case]
    with pytest.raises(ConfigError, match=want):  # what `trainscale train` checks before any rank starts
        check_data(DataConfig(name="imagefolder", path="" if case == "no_path" else str(root)))
    if case in ("empty", "empty_class"):
        with pytest.raises(ConfigError, match=want):
            data_main(["pack", str(root), str(tmp_path / "out"), "--size", "16"])
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_unusable_folder_through_the_cli_is_one_line(tmp_path):
    (tmp_path / "img").mkdir()
    r = run_cli(["train", "--data", "imagefolder", "--data.path", str(tmp_path / "img"), "--steps", "1", *FAST],
                timeout=60)
    assert r.rc == 2 and r.err.strip().count("\n") == 0 and "has no class folders" in r.err, r.text


def test_pack_refuses_a_non_empty_destination(folder, tmp_path):
    from trainscale.data.cli import main as data_main

    dst = tmp_path / "pack"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        data_main(["pack", str(folder), str(dst), "--size", "16"])
    assert (dst / "keep.txt").read_text() == "mine"


def test_startup_warnings_and_wait_advice():
    ds = TensorImages(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4))
    assert startup_warnings(ds, (3, 8, 8), 4, workers=2, prefetch=2, shm_free=10 * 2**30) == []
    low = startup_warnings(ds, (3, 224, 224), 256, workers=8, prefetch=2, shm_free=64 * 2**20)
    assert len(low) == 1 and "/dev/shm" in low[0] and "data.workers" in low[0]
    ds.files = [f"{i}.jpg" for i in range(5000)]  # a Python list copied into every worker
    lists = startup_warnings(ds, (3, 8, 8), 4, workers=2, prefetch=2, shm_free=10 * 2**30)
    assert len(lists) == 1 and "files" in lists[0] and "numpy array" in lists[0]
    assert startup_warnings(ds, (3, 8, 8), 4, workers=0, prefetch=2) == []  # no workers, nothing copied
    cfg = DataConfig(name="imagefolder", path="x", workers=1)
    assert data_wait_advice(0.05, cfg) is None and data_wait_advice(float("nan"), cfg) is None
    msg = data_wait_advice(0.4, cfg)
    assert "40%" in msg and "data.workers (now 1)" in msg and "trainscale data pack" in msg


@pytest.mark.timeout(120)
def test_input_bound_run_warns_on_rank0_only(folder, tmp_path):
    r = run_cli(["train", "--nproc", "2", "--data", "imagefolder", "--data.path", str(folder), "--model.width", "8",
                 "--data.image_size", "32", "--batch-size", "16", "--data.prefetch", "0", "--steps", "8",
                 "--data.sample_delay_ms", "2",  # a slow disk on top: input-bound on any machine
                 "--json", str(tmp_path / "s.json"), *FAST], timeout=110)
    assert r.rc == 0, r.text
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["data_wait_frac"] > 0.1 and s["data_samples_per_s"] > 0
    warnings = [ln for ln in r.err.splitlines() if "steps waited for data" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("[rank0]") and "data.workers" in warnings[0]


def test_device_batches_are_normalised_from_uint8():
    ds = TensorImages(torch.full((4, 3, 2, 2), 200, dtype=torch.uint8), torch.arange(4))
    info = DataInfo((3, 2, 2), 4, (100.0, 100.0, 100.0), (50.0, 50.0, 50.0))
    loader = TrainLoader(ds, info, CPU, 4, shuffle=False, prefetch=2)
    hx, _ = loader.next_host()
    assert hx.dtype == torch.uint8  # what the workers hand over: 1 byte per value
    loader.load_state_dict({"epoch": 0, "batch_in_epoch": 0})
    x, y = next(loader)
    assert x.dtype == torch.float32 and torch.allclose(x, torch.full_like(x, 2.0)) and y.tolist() == [0, 1, 2, 3]
    loader.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: side-stream copy and stream wait")
def test_cuda_prefetch_copies_on_a_side_stream():
    ds = TensorImages(torch.randint(0, 255, (64, 3, 8, 8), dtype=torch.uint8), torch.arange(64))
    info = DataInfo((3, 8, 8), 64, (0.0,) * 3, (1.0,) * 3)
    dev = torch.device("cuda")
    loader = TrainLoader(ds, info, dev, 16, shuffle=False, prefetch=2, workers=1)
    got = torch.cat([next(loader)[0] for _ in range(4)])
    assert got.device.type == "cuda" and torch.equal(got.cpu(), ds.images.float())
    loader.close()
