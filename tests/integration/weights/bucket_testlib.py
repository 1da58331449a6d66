"""Helpers shared by the Mooncake bucket tests and their peer process (``_bucket_peer``)."""

from __future__ import annotations

import hashlib

import numpy as np

from rollart.delta import WeightSet

JOB = "bucket-test"
MIB = 1 << 20


def synthetic_model(seed: int) -> WeightSet:
    """~3.9 MB (4 buckets of 1 MiB) of every dtype in use, with tensors larger than a 1 MiB bucket, a scalar and an empty one.

    bf16 values are arbitrary bit patterns (NaN payloads included), so any bit lost shows."""
    rng = np.random.default_rng(seed)
    arrays = {
        "model.embed_tokens.weight": rng.integers(0, 1 << 16, (1000, 1250), dtype=np.uint16),  # 2.5 MB
        "model.layers.0.mlp.down_proj.weight": rng.integers(0, 1 << 16, (300, 1000), dtype=np.uint16),
        "model.layers.0.self_attn.q_proj.weight": rng.integers(0, 1 << 16, (511, 513), dtype=np.uint16),
        "model.norm.weight": rng.standard_normal(1001).astype(np.float32),
        "lm_head.weight": rng.standard_normal((77, 1000)).astype(np.float16),
        "counts": rng.integers(-(1 << 62), 1 << 62, 333, dtype=np.int64),
        "mask": rng.integers(0, 2, 999).astype(bool),
        "bytes": rng.integers(0, 256, 12345, dtype=np.uint8),
        "scalar": np.array(seed, dtype=np.float64),
        "empty": np.zeros((0, 8), dtype=np.float32),
    }
    dtypes = {n: "BF16" for n, a in arrays.items() if a.dtype == np.uint16}
    return WeightSet.from_arrays(arrays, dtypes, version=None)


def digest(ws: WeightSet) -> str:
    """One hash over names, dtypes, shapes and exact bytes."""
    h = hashlib.sha256()
    for name in sorted(ws.arrays):
        a = np.ascontiguousarray(ws.arrays[name])
        h.update(f"{name}|{ws.dtypes[name]}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def assert_same(got: WeightSet, want: WeightSet) -> None:
    assert sorted(got.arrays) == sorted(want.arrays)
    for name, a in want.arrays.items():
        b = got.arrays[name]
        assert got.dtypes[name] == want.dtypes[name], name
        assert b.shape == a.shape and b.dtype == a.dtype, name
        assert b.tobytes() == np.ascontiguousarray(a).tobytes(), f"{name} differs"
