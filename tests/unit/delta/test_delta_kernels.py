"""The compiled encoder kernels (rollart.delta.kernels) give exactly what the numpy path gives.

Without numba the kernels are unavailable and the encoder uses numpy: the byte-identity tests then skip,
and the fallback test still runs.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rollart.delta import WeightSet, encode_delta, kernels, leb128, scratch
from rollart.delta.codec import _gap_stream, changed_positions

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
def test_scan_takes_dense_changes_and_declines_small_and_other_widths() -> None:
    a, b = _pair(kernels.MIN_ELEMENTS * 2 + 5, 0.5)
    got = kernels.scan_changed(a, b)  # faster than numpy at every density, so it takes them all
    assert got is not None and np.array_equal(got[0], changed_positions(a, b))
    b = a + np.uint16(1)  # every entry
    got = kernels.scan_changed(a, b)
    assert got is not None and np.array_equal(got[0], np.arange(a.size)) and np.array_equal(got[1], b)
    assert kernels.scan_changed(a[:100], b[:100]) is None
    assert kernels.scan_changed(a[:-5].view(np.uint32), b[:-5].view(np.uint32)) is None


@needs_numba
def test_scan_parts_concatenates_members_with_their_offsets() -> None:
    """A fused engine tensor (e.g. q/k/v): members scanned into one pair of arrays, offsets added; the
    output grows when a later member changes far more than the first ones' samples said."""
    n = kernels.MIN_ELEMENTS * 3 + 7
    (a0, b0), (a1, b1), (a2, b2) = _pair(n, 0.001, 1), _pair(n, 0.02, 2), _pair(n, 0.0, 3)
    b2[kernels._SAMPLE :] ^= 3  # nearly all of member 2, none of it in its sample
    members = [(a0, b0, 0), (a1, b1, n), (a2, b2, 2 * n)]
    got = kernels.scan_parts(members)
    assert got is not None
    want = [changed_positions(a, b) for a, b, _ in members]
    assert np.array_equal(got[0], np.concatenate([w + off for w, (_, _, off) in zip(want, members, strict=True)]))
    assert np.array_equal(got[1], np.concatenate([b[w] for w, (_, b, _) in zip(want, members, strict=True)]))
    assert kernels.scan_parts([(a0, b0, 0), (a0[:100], b0[:100], n)]) is None  # one member too small
    # format 3: the same positions, values new XOR old
    got_x = kernels.scan_parts(members, xor=True)
    assert got_x is not None and np.array_equal(got_x[0], got[0])
    xor = [(b ^ a)[w] for w, (a, b, _) in zip(want, members, strict=True)]
    assert np.array_equal(got_x[1], np.concatenate(xor))


@needs_numba
@pytest.mark.parametrize("budget", [4096 - 10, 64 * 1024, 4 * 1024 * 1024])
@pytest.mark.parametrize("gaps", [[1, 2, 5], [1, 5, 127, 128, 300], [1, 5, 127, 128, 300, 20000, 3_000_000]])
def test_gap_segments_match_numpy(gaps: list[int], budget: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-pass kernel gives the numpy code's stream, cuts and slices: with few multi-byte gaps (numpy's
    low-byte path), many, and huge ones; segments that fit the budget and cover every entry once."""
    rng = np.random.default_rng(3)
    idx = np.cumsum(rng.choice(gaps, 50_000)).astype(np.int64)
    got = kernels.gap_segments(idx, 2, budget)
    assert got is not None
    monkeypatch.setitem(kernels._state, "ok", False)
    want = _gap_stream(idx, 2, budget)
    assert got[0].tobytes() == want[0].tobytes() == leb128.encode(np.diff(idx).astype(np.uint64))
    assert got[1] == want[1] and got[2] == want[2]
    bounds, slices = got[1], got[2]
    assert bounds[0] == 0 and bounds[-1] == idx.size and len(slices) == len(bounds) - 1
    for (s, e), (lo, hi) in zip(itertools.pairwise(bounds), slices, strict=True):
        assert e > s and (hi - lo) + (e - s) * 2 <= budget
        assert leb128.decode_indices(got[0][lo:hi], e - s - 1, 2**62).size == e - s - 1


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
    assert kernels.scan_changed(a, b) is None and kernels.gap_segments(np.arange(10_000), 2, 4096) is None


@needs_numba
def test_byte_planes_kernel_matches_numpy() -> None:
    rng = np.random.default_rng(5)
    v = rng.integers(0, 1 << 16, kernels.MIN_ELEMENTS + 3, dtype=np.uint16)
    out = np.empty(2 * v.size, np.uint8)
    assert kernels.byte_planes16(v, out)
    assert np.array_equal(out, np.ascontiguousarray(v.view(np.uint8).reshape(-1, 2).T).reshape(-1))


def test_interleaved_encoders_keep_their_own_work_buffers() -> None:
    """Two encoders consumed segment by segment in turn (one thread, e.g. two jobs in one event loop) each
    write what they write alone: the reused work buffers are per encoder, never shared while in use."""
    one, two = _model(0.03), _model(0.2)
    two[1].arrays["model.layers.0.self_attn.q_proj.weight"][:] ^= 7  # a different delta from the first
    alone = [list(encode_delta(b, t, job="j", version=1, key=KEY, max_segment_bytes=64 * 1024)) for b, t in (one, two)]
    gens = [encode_delta(b, t, job="j", version=1, key=KEY, max_segment_bytes=64 * 1024) for b, t in (one, two)]
    got: list[list[bytes]] = [[], []]
    live = [0, 1]
    while live:
        for i in list(live):
            seg = next(gens[i], None)
            if seg is None:
                live.remove(i)
            else:
                got[i].append(seg)
    assert got == alone


def test_scratch_reuses_and_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    s = scratch.Scratch()
    a = s.array("x", 1000, np.int64)
    b = s.array("x", 500, np.int64)
    assert np.shares_memory(a, b)  # reused, not reallocated
    assert s.array("x", 2000, np.uint16).base is not None
    monkeypatch.setattr(scratch, "MAX_KEPT_BYTES", 4096)
    big = s.array("y", 10_000, np.uint8)
    assert big.size == 10_000 and "y" not in s._bufs  # too big to keep: handed out fresh
    first = scratch.acquire()
    assert scratch.acquire() is not first  # in use: never handed out twice
    scratch.release(first)
    assert scratch.acquire() is first
