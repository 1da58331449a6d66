"""The compiled encoder kernels (rollart.delta.kernels) give exactly what the numpy path gives.

Without numba the kernels are unavailable and the encoder uses numpy: the byte-identity tests then skip,
and the fallback test still runs.
"""

from __future__ import annotations

import numpy as np
import pytest

from rollart.delta import WeightSet, encode_delta, kernels, leb128
from rollart.delta.codec import changed_positions

needs_numba = pytest.mark.skipif(not kernels.available(), reason="numba not installed: the numpy path is used")
KEY = b"k" * 32


def _pair(n: int, density: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    b = a.copy()
    pos = np.flatnonzero(rng.random(n) < density)
    b[pos] ^= rng.integers(1, 1 << 16, pos.size, dtype=np.uint16)  # every chosen entry really changes
    return a, b


@needs_numba
@pytest.mark.parametrize("density", [0.0, 1e-5, 0.01, 0.05, 0.15])
# Whole 64-byte lines only; a tail of 3 elements after the last word; 5 words after the last whole line.
@pytest.mark.parametrize("n", [kernels.MIN_ELEMENTS, kernels.MIN_ELEMENTS * 5 + 3, kernels.MIN_ELEMENTS + 23])
def test_scan_matches_numpy(n: int, density: float) -> None:
    a, b = _pair(n, density)
    got = kernels.scan_changed(a, b)
    assert got is not None
    pos = changed_positions(a, b)
    assert got[0].dtype == np.int64 and np.array_equal(got[0], pos)
    assert got[1].dtype == np.uint16 and np.array_equal(got[1], b[pos])


@needs_numba
def test_scan_grows_when_the_sample_misleads() -> None:
    """The output is sized from a sample of the first entries; a change concentrated later still fits."""
    n = kernels.MIN_ELEMENTS * 40
    a, b = _pair(n, 0.0)
    b[n // 2 :] ^= 1  # half the tensor changes, none of it in the sample
    got = kernels.scan_changed(a, b)
    assert got is not None and np.array_equal(got[0], np.arange(n // 2, n))


@needs_numba
def test_scan_declines_dense_small_and_other_widths() -> None:
    a, b = _pair(kernels.MIN_ELEMENTS * 2, 0.5)
    assert kernels.scan_changed(a, b) is None  # dense change: numpy's nonzero is faster
    assert kernels.scan_changed(a[:100], b[:100]) is None
    assert kernels.scan_changed(a.view(np.uint32), b.view(np.uint32)) is None


@needs_numba
def test_gap_stream_matches_leb128() -> None:
    rng = np.random.default_rng(3)
    idx = np.cumsum(rng.choice([1, 5, 127, 128, 300, 20000, 3_000_000], 50_000)).astype(np.int64)
    got = kernels.gap_leb128(idx)
    assert got is not None
    gaps = np.diff(idx).astype(np.uint64)
    lengths = leb128.encoded_lengths(gaps)
    assert got[0].tobytes() == leb128.encode(gaps, lengths)
    assert np.array_equal(got[1][1:], np.cumsum(lengths)) and got[1][0] == 0


def _model(density: float) -> tuple[WeightSet, WeightSet]:
    rng = np.random.default_rng(7)
    base = {
        "model.embed_tokens.weight": rng.integers(0, 1 << 16, (512, 256), dtype=np.uint16),
        "model.layers.0.self_attn.q_proj.weight": rng.integers(0, 1 << 16, (256, 256), dtype=np.uint16),
        "model.layers.0.self_attn.k_proj.weight": rng.integers(0, 1 << 16, (128, 256), dtype=np.uint16),
        "model.layers.0.self_attn.v_proj.weight": rng.integers(0, 1 << 16, (128, 256), dtype=np.uint16),
        "model.norm.weight": rng.integers(0, 1 << 16, (256,), dtype=np.uint16),
    }
    target = {}
    for name, arr in base.items():
        b = arr.copy().reshape(-1)
        pos = np.flatnonzero(rng.random(b.size) < density)
        b[pos] += 1
        target[name] = b.reshape(arr.shape)
    dtypes = {n: "BF16" for n in base}
    return WeightSet(base, dtypes, version=0, applied_hash=b"\x01" * 32), WeightSet(target, dtypes, version=1)


@needs_numba
@pytest.mark.parametrize("density", [0.003, 0.03, 0.1, 0.4])
def test_encoder_output_is_byte_identical_with_and_without_kernels(
    density: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, target = _model(density)
    fast = list(encode_delta(base, target, job="j", version=1, key=KEY, max_segment_bytes=64 * 1024))
    monkeypatch.setitem(kernels._state, "ok", False)
    assert not kernels.available()
    slow = list(encode_delta(base, target, job="j", version=1, key=KEY, max_segment_bytes=64 * 1024))
    assert fast == slow


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setenv("ROLLART_DELTA_NUMBA", "0")
    assert not kernels.available()
    a, b = _pair(kernels.MIN_ELEMENTS, 0.01)
    assert kernels.scan_changed(a, b) is None and kernels.gap_leb128(np.arange(10_000)) is None
