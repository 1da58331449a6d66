"""Compiled inner loops of the encoder (numba, optional): the same results as the numpy code, faster.

The encoder's floor is the full compare of two models (docs/delta-format.md, "Encoder choices"). numpy does
it in three passes over memory (``not_equal`` into a mask, ``nonzero`` of the mask, a gather of the new
values); :func:`scan_changed` does it in one, listing changed 64-bit words branch-free and splitting only
those into entries. The LEB128 gap stream is built in one pass as well (:func:`gap_leb128`).

Every function here returns exactly what the numpy path returns (tests/unit/delta/test_delta_kernels.py compares
them), so the encoder's output is byte-identical with or without numba. numba is not a dependency of
``rollart``: without it, or with ``ROLLART_DELTA_NUMBA=0``, :func:`available` is False and the encoder uses
numpy. It is imported on first use only (compiling takes ~0.5 s once; the machine code is cached on disk).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

MIN_ELEMENTS = 1 << 16  # below this the numpy path is as fast and nothing needs compiling
# Above this changed fraction (sampled) most words hold a change and numpy's nonzero is as fast or faster.
MAX_SCAN_FRACTION = 0.2
SPARSE_FRACTION = 0.02  # at most this changed (sampled): skip unchanged 64-byte lines first
_SAMPLE = 1 << 16

_state: dict[str, Any] = {}


def available() -> bool:
    """Whether the compiled kernels can be used (numba importable and not disabled)."""
    if "ok" not in _state:
        _state["ok"] = False
        if os.environ.get("ROLLART_DELTA_NUMBA", "1") != "0":
            try:
                _state.update(_compile())
                _state["ok"] = True
            except Exception:  # noqa: BLE001 - no numba, or it cannot compile here: the numpy path is exact too
                _state["ok"] = False
    return bool(_state["ok"])


def _compile() -> dict[str, Any]:
    import numba  # noqa: PLC0415 - optional, heavy: imported on first use only

    jit = numba.njit(nogil=True, boundscheck=False, cache=True)

    @jit
    def split_lanes(a, b, changed, m, pos, vals, k):
        # Pass 2 of both scans: the m changed words listed in `changed` split into their 4 lanes, branch-free
        # (every lane is written, the count moves only for a changed one).
        for t in range(m):
            j = changed[t]
            x = a[j] ^ b[j]
            nb = b[j]
            base = j * 4
            for lane in range(4):
                pos[k] = base + lane
                vals[k] = (nb >> (16 * lane)) & 0xFFFF
                k += ((x >> (16 * lane)) & 0xFFFF) != 0
        return k

    @jit
    def scan16(a, b, w, stop, pos, vals, k):
        # a, b: the two tensors as uint64 words (4 bf16/fp16 lanes each), in blocks of B words. Pass 1 lists
        # the block's changed words without a branch (every word is written, the count moves on change);
        # pass 2 splits only those into lanes, branch-free as well. A branch per word would mispredict at
        # a few percent of changed entries (3x slower at 10%).
        B = 2048
        changed = np.empty(B, np.int64)
        cap = pos.size - 4 * B
        while w < stop and k <= cap:
            e = min(stop, w + B)
            m = 0
            for j in range(w, e):
                changed[m] = j
                m += a[j] != b[j]
            k = split_lanes(a, b, changed, m, pos, vals, k)
            w = e
        return w, k

    @jit
    def scan16_sparse(a, b, w, stop, pos, vals, k):
        # scan16 for a few changes (<= SPARSE_FRACTION): first one vectorised OR over each 64-byte line of
        # 8 words, and only a line holding a change goes through pass 1 (-23% CPU at 1% changed).
        B = 2048
        changed = np.empty(B, np.int64)
        cap = pos.size - 4 * B
        while w < stop and k <= cap:
            e = min(stop, w + B)
            m = 0
            j = w
            while j + 8 <= e:
                acc = np.uint64(0)
                for t in range(8):
                    acc |= a[j + t] ^ b[j + t]
                if acc:
                    for t in range(j, j + 8):
                        changed[m] = t
                        m += a[t] != b[t]
                j += 8
            for t in range(j, e):
                changed[m] = t
                m += a[t] != b[t]
            k = split_lanes(a, b, changed, m, pos, vals, k)
            w = e
        return w, k

    @jit
    def leb_gaps(idx, stream, ends):
        # LEB128 of idx[g+1] - idx[g]; ends[g + 1] = end offset of gap g in the stream (ends[0] = 0).
        o = 0
        for g in range(idx.size - 1):
            v = idx[g + 1] - idx[g]
            while v >= 0x80:
                stream[o] = (v & 0x7F) | 0x80
                v >>= 7
                o += 1
            stream[o] = v
            o += 1
            ends[g + 1] = o
        return o

    return {"scan16": scan16, "scan16_sparse": scan16_sparse, "leb_gaps": leb_gaps}


def scan_changed(old: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(positions int64, new values) where two flat raw uint16 arrays differ; None when the numpy path should
    run instead (no numba, another width, a small tensor, or a dense change, judged from a sample)."""
    if old.dtype.itemsize != 2 or old.size < MIN_ELEMENTS or not available():
        return None
    sampled = np.count_nonzero(old[:_SAMPLE] != new[:_SAMPLE]) / min(n := old.size, _SAMPLE)
    if sampled > MAX_SCAN_FRACTION:
        return None
    words = n // 4
    a64 = old[: words * 4].view(np.uint64)
    b64 = new[: words * 4].view(np.uint64)
    cap = (1 << 16) + int(n * min(1.0, 1.5 * sampled + 0.01))  # grown (copied) only if the sample misled
    pos = np.empty(cap, np.int64)
    vals = np.empty(cap, np.uint16)
    w = k = 0
    scan = _state["scan16_sparse" if sampled <= SPARSE_FRACTION else "scan16"]
    while True:
        w, k = scan(a64, b64, w, words, pos, vals, k)
        if w >= words:
            break
        pos = np.resize(pos, 2 * pos.size)
        vals = np.resize(vals, 2 * vals.size)
    tail = np.flatnonzero(old[words * 4 :] != new[words * 4 :])
    if tail.size:  # at most 3 elements after the last whole word
        tail += words * 4
        return np.concatenate([pos[:k], tail]), np.concatenate([vals[:k], new[tail]])
    return pos[:k], vals[:k].view(new.dtype)


def gap_leb128(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(LEB128 stream of the gaps between ascending positions, ends) as ``leb128.encode`` and its cumulative
    lengths give them: ends[0] = 0, ends[g + 1] = where gap g ends. None without the kernels."""
    if idx.size < MIN_ELEMENTS // 16 or not available():
        return None
    stream = np.empty(10 * (idx.size - 1), np.uint8)
    ends = np.zeros(idx.size, np.int64)
    o = _state["leb_gaps"](idx.astype(np.int64, copy=False), stream, ends)
    return stream[:o], ends
