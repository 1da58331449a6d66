"""Bucket layout, keys and manifest validation (pure functions: no Mooncake needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rollart.weights import buckets as bk


def arrays() -> tuple[dict[str, np.ndarray], dict[str, str]]:
    a = {
        "b": np.zeros(1000, np.uint16),
        "a": np.zeros((3, 5), np.float32),
        "c": np.zeros(0, np.int64),
        "d": np.zeros(7, bool),
    }
    return a, {"a": "F32", "b": "BF16", "c": "I64", "d": "BOOL"}


def test_layout_is_sorted_aligned_and_tiled():
    a, dts = arrays()
    specs, total, ranges = bk.plan_layout(a, dts, bucket_bytes=640)
    assert [s.name for s in specs] == ["a", "b", "c", "d"]
    assert all(s.offset % bk.ALIGN == 0 for s in specs)
    assert [(s.offset, s.nbytes) for s in specs] == [(0, 60), (64, 2000), (2112, 0), (2112, 7)]
    assert total == 2119
    assert ranges == [(0, 640), (640, 640), (1280, 640), (1920, 199)]
    assert bk.plan_layout({}, {}, 640) == ([], 0, [])
    with pytest.raises(ValueError):
        bk.plan_layout(a, dts, bucket_bytes=8)


def test_keys():
    ns = bk.namespace("job-1.x")
    assert ns == "rollart/job-1.x/weights"
    assert bk.manifest_key(ns, 42) == "rollart/job-1.x/weights/v000000000042/manifest"
    assert bk.latest_key(ns) == "rollart/job-1.x/weights/latest"
    assert bk.bucket_keys(ns, 42, "ab12", 2) == [
        "rollart/job-1.x/weights/v000000000042/ab12/00000",
        "rollart/job-1.x/weights/v000000000042/ab12/00001",
    ]
    for bad in ("", "a/b", "a b", "x" * 129):
        with pytest.raises(ValueError):
            bk.namespace(bad)
    with pytest.raises(ValueError):
        bk.manifest_key(ns, -1)


def manifest(**over) -> bk.BucketManifest:
    a, dts = arrays()
    specs, total, ranges = bk.plan_layout(a, dts, bucket_bytes=1024)
    fields = dict(
        job="j",
        version=3,
        epoch="e",
        bucket_bytes=1024,
        total_bytes=total,
        buckets=tuple(bk.BucketSpec(f"k{i}", off, size, "0" * 64) for i, (off, size) in enumerate(ranges)),
        tensors=tuple(specs),
        created_at=1.5,
        applied_hash="ab" * 32,
        metadata={"h": "x"},
    )
    fields.update(over)
    return bk.BucketManifest(**fields)


def test_manifest_round_trip():
    m = manifest()
    assert bk.BucketManifest.from_json(m.to_json(), job="j", version=3) == m


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.update(version=4), "names j v4"),
        (lambda d: d.update(format="x"), "malformed"),
        (lambda d: d["buckets"].pop(1), "does not continue"),
        (lambda d: d.update(total_bytes=d["total_bytes"] + 1), "cover"),
        (lambda d: d["buckets"][0].__setitem__(3, "zz"), "SHA-256"),
        (lambda d: d["tensors"][0].__setitem__(1, "F64"), "does not fit"),
        (lambda d: d["tensors"][0].__setitem__(1, "Q7"), "unsupported dtype"),
        (lambda d: d["tensors"][1].__setitem__(3, 10**6), "does not fit"),
        (lambda d: d.pop("tensors"), "malformed"),
    ],
)
def test_manifest_validation(mutate, match):
    doc = json.loads(manifest().to_json())
    mutate(doc)
    with pytest.raises(bk.WeightsIntegrityError, match=match):
        bk.BucketManifest.from_json(json.dumps(doc).encode(), job="j", version=3)


def test_config_from_env(monkeypatch):
    monkeypatch.delenv("ROLLART_MOONCAKE_MASTER", raising=False)
    with pytest.raises(bk.MooncakeUnavailableError, match="ROLLART_MOONCAKE_MASTER"):
        bk.MooncakeConfig.from_env()
    monkeypatch.setenv("ROLLART_MOONCAKE_MASTER", "127.0.0.1:5")
    monkeypatch.setenv("ROLLART_MOONCAKE_SEGMENT_BYTES", str(1 << 30))
    cfg = bk.MooncakeConfig.from_env(rpc_timeout_ms=100)
    assert (cfg.master, cfg.segment_bytes, cfg.rpc_timeout_ms) == ("127.0.0.1:5", 1 << 30, 100)
