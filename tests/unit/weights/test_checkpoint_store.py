"""Checkpoint store: round trips, atomic commit (a writer killed before its manifest), integrity, pruning,
URLs; the S3 backend's key layout against an in-memory stand-in (not a real S3: none is reachable here)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rollart.delta import WeightSet, save_safetensors
from rollart.weights import checkpoint_store as cs
from rollart.weights.checkpoint_store import (
    CheckpointError,
    CheckpointExistsError,
    CheckpointIntegrityError,
    CheckpointNotFoundError,
    DirectoryStore,
    S3Store,
    open_store,
)


def weights(seed: int) -> WeightSet:
    """Every kind of tensor a checkpoint holds: bf16 bit patterns (NaN payloads included), f32, bool,
    int64, a scalar and an empty tensor."""
    rng = np.random.default_rng(seed)
    arrays = {
        "model.embed_tokens.weight": rng.integers(0, 1 << 16, (64, 32), dtype=np.uint16),
        "model.layers.0.mlp.up_proj.weight": rng.integers(0, 1 << 16, (48, 32), dtype=np.uint16),
        "model.norm.weight": rng.standard_normal(32).astype(np.float32),
        "mask": rng.integers(0, 2, 7).astype(bool),
        "step": np.array(seed, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    dtypes = {"model.embed_tokens.weight": "BF16", "model.layers.0.mlp.up_proj.weight": "BF16"}
    return WeightSet.from_arrays(arrays, dtypes)


def same(a: WeightSet, b: WeightSet) -> bool:
    return a.arrays.keys() == b.arrays.keys() and all(
        a.dtypes[n] == b.dtypes[n]
        and a.arrays[n].shape == b.arrays[n].shape
        and a.arrays[n].tobytes() == b.arrays[n].tobytes()
        for n in a.arrays
    )


def test_round_trip_manifest_and_memory_map(tmp_path):
    store = open_store(tmp_path / "ckpt")
    ws = weights(1)
    info = store.put(3, ws, metadata={"job": "j1"})
    path = tmp_path / "ckpt" / "v000000000003" / "model.safetensors"
    assert store.versions() == [3]
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info.size == path.stat().st_size
    assert info.tensor_bytes == ws.nbytes and info.num_tensors == len(ws)
    assert info.metadata == {"job": "j1"}
    doc = json.loads((path.parent / "manifest.json").read_text())
    assert doc["version"] == 3 and doc["hash"] == {"algorithm": "sha256", "hex": info.sha256}
    assert doc["size"] == info.size and doc["created_at"] == info.created_at
    assert store.info(3) == info

    got = store.open(3)
    assert got.version == 3 and same(got, ws)
    arr = got.arrays["model.embed_tokens.weight"]
    assert isinstance(arr.base, memoryview) or not arr.flags.owndata  # a view of the mapping, not a copy
    with pytest.raises(ValueError):
        arr[0, 0] = 1  # read-only mapping
    cow = store.open(3, writable=True)
    cow.arrays["model.norm.weight"][:] = 0  # private copy-on-write: the store is untouched
    assert same(store.open(3), ws)


def test_latest_at_most_and_exists(tmp_path):
    store = DirectoryStore(tmp_path)
    assert store.latest() is None and store.versions() == []
    for v in (1, 3, 5):
        store.put(v, weights(v))
    assert store.versions() == [1, 3, 5]
    assert store.latest().version == 5
    assert store.latest(at_most=4).version == 3
    assert store.latest(at_most=3).version == 3
    assert store.latest(at_most=0) is None
    with pytest.raises(CheckpointExistsError):
        store.put(3, weights(99))
    assert store.put(3, weights(99), exist_ok=True) == store.info(3)
    assert same(store.open(3), weights(3))  # the committed checkpoint is immutable
    with pytest.raises(CheckpointNotFoundError):
        store.open(4)
    with pytest.raises(ValueError, match="hold version 7"):
        ws = weights(6)
        ws.version = 7
        store.put(6, ws)


CRASH_BEFORE_MANIFEST = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from rollart.weights import checkpoint_store as cs
    def die(self, path, data):  # the writer is killed after the file, before the manifest
        os.kill(os.getpid(), signal.SIGKILL)
    cs.DirectoryStore._write_manifest = die
    store = cs.DirectoryStore(sys.argv[1])
    store.put(int(sys.argv[2]), {"w": np.arange(1000, dtype=np.float32)})
    """
)


def test_writer_killed_before_manifest_leaves_no_visible_checkpoint(tmp_path):
    store = DirectoryStore(tmp_path)
    store.put(1, weights(1))
    proc = subprocess.run([sys.executable, "-c", CRASH_BEFORE_MANIFEST, str(tmp_path), "2"], capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    vdir = tmp_path / "v000000000002"
    assert (vdir / "model.safetensors").exists() and not (vdir / "manifest.json").exists()
    # Invisible: readers still see version 1 as the newest.
    assert store.versions() == [1]
    assert store.latest().version == 1
    with pytest.raises(CheckpointNotFoundError):
        store.open(2)
    # The version can be written again, completely this time.
    store.put(2, weights(2))
    assert store.versions() == [1, 2] and same(store.open(2), weights(2))


def test_half_written_file_and_stray_temp_files_are_invisible(tmp_path):
    store = DirectoryStore(tmp_path)
    vdir = tmp_path / "v000000000004"
    vdir.mkdir()
    (vdir / ".model.safetensors.tmp-123").write_bytes(b"\x00" * 100)  # a writer died mid-file
    assert store.versions() == [] and store.latest() is None
    store.put(5, weights(5))
    assert store.prune(keep=1) == []
    assert not vdir.exists()  # incomplete folders older than the newest checkpoint are cleaned up


def test_corruption_is_detected(tmp_path):
    store = DirectoryStore(tmp_path)
    info = store.put(1, weights(1))
    path = Path(info.location)
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0x40  # one bit in the last tensor's bytes
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointIntegrityError, match="SHA-256"):
        store.open(1)
    store.open(1, verify=False)  # an explicit opt-out still maps it
    path.write_bytes(bytes(raw[:-8]))
    with pytest.raises(CheckpointIntegrityError, match="bytes"):
        store.open(1, verify=False)  # a size mismatch is caught even without hashing
    path.unlink()
    with pytest.raises(CheckpointIntegrityError, match="missing"):
        store.open(1)
    (path.parent / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointIntegrityError, match="malformed"):
        store.info(1)


def test_manifest_of_another_version_is_rejected(tmp_path):
    store = DirectoryStore(tmp_path)
    store.put(1, weights(1))
    store.put(2, weights(2))
    src = tmp_path / "v000000000001" / "manifest.json"
    (tmp_path / "v000000000002" / "manifest.json").write_bytes(src.read_bytes())
    with pytest.raises(CheckpointIntegrityError, match="names version 1"):
        store.info(2)


def test_prune_keeps_newest(tmp_path):
    store = DirectoryStore(tmp_path)
    for v in range(1, 6):
        store.put(v, weights(v))
    held = store.open(2)  # an open mapping survives the prune (POSIX unlink)
    assert store.prune(keep=2) == [1, 2, 3]
    assert store.versions() == [4, 5]
    assert same(held, weights(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json", "v000000000004", "v000000000005"]
    with pytest.raises(ValueError):
        store.prune(keep=0)
    assert store.delete(4) and not store.delete(4)
    assert store.versions() == [5]
    # index.json (what an HTTP reader lists) follows every commit and delete
    assert json.loads((tmp_path / "index.json").read_text()) == {"format": cs.INDEX_FORMAT, "versions": [5]}


def test_put_file_copies_and_validates(tmp_path):
    src = tmp_path / "src.safetensors"
    save_safetensors(src, weights(7))
    store = DirectoryStore(tmp_path / "ckpt")
    info = store.put_file(7, src, metadata={"from": "trainer"})
    assert info.sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    assert same(store.open(7), weights(7))
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\xff" * 16)
    with pytest.raises(Exception, match="header"):
        store.put_file(8, bad)
    assert store.versions() == [7]


def test_urls(tmp_path):
    assert isinstance(open_store(f"file://{tmp_path}/a"), DirectoryStore)
    assert open_store(f"file://{tmp_path}/a").root == tmp_path / "a"
    assert open_store(str(tmp_path / "b")).root == tmp_path / "b"
    with pytest.raises(ValueError):
        open_store("ftp://host/x")
    with pytest.raises(ValueError):
        open_store("file://otherhost/x")
    try:
        import boto3  # noqa: F401
    except ImportError:
        with pytest.raises(CheckpointError, match="boto3"):
            open_store("s3://bucket/prefix")


# ---------------------------------------------------------------------------------------------------------
# S3: key layout (the only part testable without an S3 endpoint), through an in-memory stand-in client.


class NoSuchKey(Exception):
    def __init__(self) -> None:
        super().__init__("NoSuchKey")
        self.response = {"Error": {"Code": "NoSuchKey"}}


class MemoryS3:
    """The five boto3 S3 client calls the store uses, over a dict; records the order of writes."""

    def __init__(self, page_size: int = 2) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}
        self.log: list[tuple[str, str]] = []
        self.page_size = page_size

    def upload_file(self, filename, bucket, key):
        self.objects[bucket, key] = Path(filename).read_bytes()
        self.log.append(("put", key))

    def put_object(self, Bucket, Key, Body):
        self.objects[Bucket, Key] = bytes(Body)
        self.log.append(("put", Key))

    def get_object(self, Bucket, Key):
        if (Bucket, Key) not in self.objects:
            raise NoSuchKey()
        return {"Body": io.BytesIO(self.objects[Bucket, Key])}

    def download_file(self, bucket, key, filename):
        if (bucket, key) not in self.objects:
            raise NoSuchKey()
        Path(filename).write_bytes(self.objects[bucket, key])

    def delete_object(self, Bucket, Key):
        self.objects.pop((Bucket, Key), None)
        self.log.append(("delete", Key))

    def list_objects_v2(self, Bucket, Prefix, ContinuationToken=None):
        keys = sorted(k for b, k in self.objects if b == Bucket and k.startswith(Prefix))
        start = int(ContinuationToken or 0)
        page = keys[start : start + self.page_size]
        more = start + self.page_size < len(keys)
        out = {"Contents": [{"Key": k} for k in page], "IsTruncated": more}
        if more:
            out["NextContinuationToken"] = str(start + self.page_size)
        return out


def test_s3_key_layout():
    assert cs.s3_keys("runs/r1", 7) == (
        "runs/r1/v000000000007/model.safetensors",
        "runs/r1/v000000000007/manifest.json",
    )
    assert cs.s3_keys("/runs/r1/", 7) == cs.s3_keys("runs/r1", 7)
    assert cs.s3_keys("", 12) == ("v000000000012/model.safetensors", "v000000000012/manifest.json")
    assert cs.parse_s3_manifest_key("runs/r1", "runs/r1/v000000000007/manifest.json") == 7
    assert cs.parse_s3_manifest_key("runs/r1", "runs/r1/v000000000007/model.safetensors") is None
    assert cs.parse_s3_manifest_key("runs/r1", "runs/r10/v000000000007/manifest.json") is None
    assert cs.parse_s3_manifest_key("runs/r1", "runs/r1/x/v000000000007/manifest.json") is None
    assert cs.parse_s3_manifest_key("", "v000000000003/manifest.json") == 3
    with pytest.raises(ValueError):
        cs.s3_keys("p", -1)


def test_s3_store_against_in_memory_stand_in(tmp_path):
    fake = MemoryS3()
    store = open_store("s3://bkt/runs/r1?endpoint=http://127.0.0.1:9", client=fake, cache_dir=tmp_path / "cache")
    assert isinstance(store, S3Store) and store.bucket == "bkt" and store.prefix == "runs/r1"
    for v in (1, 2, 3):
        store.put(v, weights(v))
    # The file goes up before the manifest that commits it.
    assert fake.log[:2] == [
        ("put", "runs/r1/v000000000001/model.safetensors"),
        ("put", "runs/r1/v000000000001/manifest.json"),
    ]
    fake.objects["bkt", "runs/r1/v000000000009/model.safetensors"] = b"uncommitted"  # no manifest: invisible
    fake.objects["bkt", "runs/r10/v000000000008/manifest.json"] = b"{}"  # another prefix
    assert store.versions() == [1, 2, 3]  # across several listing pages
    assert store.latest(at_most=2).version == 2
    got = store.open(2)
    assert same(got, weights(2)) and got.version == 2
    assert str(store.local_path(2)).startswith(str(tmp_path / "cache" / "bkt" / "runs/r1"))
    # A tampered object is caught on download.
    key = "runs/r1/v000000000003/model.safetensors"
    raw = bytearray(fake.objects["bkt", key])
    raw[-1] ^= 1
    fake.objects["bkt", key] = bytes(raw)
    with pytest.raises(CheckpointIntegrityError):
        store.open(3)
    fake.log.clear()
    assert store.prune(keep=1) == [1, 2]
    assert fake.log[:2] == [
        ("delete", "runs/r1/v000000000001/manifest.json"),
        ("delete", "runs/r1/v000000000001/model.safetensors"),
    ]
    assert store.versions() == [3]
    with pytest.raises(CheckpointNotFoundError):
        store.info(1)


def test_directory_layout_matches_s3_layout(tmp_path):
    """Both backends put a version at <root>/vNNNNNNNNNNNN/{model.safetensors,manifest.json}."""
    store = DirectoryStore(tmp_path)
    store.put(7, weights(7))
    model_key, manifest_key = cs.s3_keys("", 7)
    assert (tmp_path / model_key).is_file() and (tmp_path / manifest_key).is_file()
    assert not [p for p in os.listdir(tmp_path / "v000000000007") if p.startswith(".")]  # no temp files left
