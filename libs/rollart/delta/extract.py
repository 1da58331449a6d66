"""Finding what changed between two weight sets: positions, new values, and the LEB128 gap stream.

Invariant: positions are flat (C order) int64, strictly ascending, of the engine tensor (a fused member's
block offset added); values are the new raw bit patterns there, compared bit for bit (NaN payloads and
the sign of zero count). Format: docs/delta-format.md ("Index stream").
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np

from . import dtypes as dt
from . import kernels, leb128
from .errors import IncompatibleTargetError
from .names import EngineTensor
from .scratch import Scratch

_EXTRACT_CHUNK = 1 << 18  # elements compared per step: the temporary bool mask stays in cache (~1.5x faster)


def changed_positions(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Flat positions (int64, ascending) where two same-shaped arrays differ bit for bit.

    Compares raw unsigned integers of the element width, so NaNs with equal payloads are equal,
    and 0.0 / -0.0 differ.
    """
    if old.shape != new.shape or old.dtype.itemsize != new.dtype.itemsize:
        raise IncompatibleTargetError(f"shape/dtype differ: {old.shape} {old.dtype} vs {new.shape} {new.dtype}")
    raw = dt._RAW[old.dtype.itemsize]
    a = np.ascontiguousarray(old).reshape(-1).view(raw)
    b = np.ascontiguousarray(new).reshape(-1).view(raw)
    if a.size <= _EXTRACT_CHUNK:
        return np.flatnonzero(a != b)
    mask = np.empty(_EXTRACT_CHUNK, dtype=np.bool_)
    out = []
    for s in range(0, a.size, _EXTRACT_CHUNK):
        e = min(s + _EXTRACT_CHUNK, a.size)
        m = mask[: e - s]
        np.not_equal(a[s:e], b[s:e], out=m)
        pos = np.flatnonzero(m)
        if pos.size:
            out.append(np.add(pos, s, out=pos) if s else pos)
    return np.concatenate(out) if out else np.empty(0, np.int64)


def extract_tensor(
    et: EngineTensor,
    base: Mapping[str, np.ndarray],
    target: Mapping[str, np.ndarray],
    scratch: Scratch | None = None,
    xor: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Changed positions of an engine tensor (member block offsets added) and the new raw values (``xor``:
    new XOR base, format 3). With ``scratch`` they may be views of its buffers (valid until the next tensor
    is extracted with it)."""
    dtype = dt.by_name(et.dtype)
    members: list[tuple[np.ndarray, np.ndarray, int]] | None = []
    for p in et.parts:
        a, b = base[p.hf_name], target[p.hf_name]
        if a.shape != b.shape or not a.dtype.itemsize == b.dtype.itemsize == dtype.itemsize or members is None:
            members = None
            continue
        flat_a, flat_b = (np.ascontiguousarray(x).reshape(-1).view(dtype.raw) for x in (a, b))
        members.append((flat_a, flat_b, p.offset))
    fast = kernels.scan_parts(members, scratch, xor) if members else None
    if fast is not None:  # one compiled pass over every member: compare, positions and values (same as below)
        return fast
    idx_parts, val_parts = [], []
    for p in et.parts:
        a, b = base[p.hf_name], target[p.hf_name]
        pos = changed_positions(a, b)
        if pos.size:
            idx_parts.append(pos + p.offset if p.offset else pos)
            new = np.ascontiguousarray(b).reshape(-1).view(dtype.raw)[pos]
            if xor:
                new ^= np.ascontiguousarray(a).reshape(-1).view(dtype.raw)[pos]
            val_parts.append(new)
    if not idx_parts:
        return np.empty(0, np.int64), np.empty(0, dtype.raw)
    if len(idx_parts) == 1:
        return idx_parts[0], val_parts[0]
    return np.concatenate(idx_parts), np.concatenate(val_parts)


def _gap_stream(
    idx: np.ndarray, itemsize: int, budget: int, scratch: Scratch | None = None
) -> tuple[np.ndarray, list[int], list[tuple[int, int]]]:
    """LEB128 of the gaps between ascending positions, segment bounds within ``budget``, and each segment's
    slice ``(lo, hi)`` of the gap stream (its entries after the first: the first is stored absolute).

    The cut rule (the encoder's choice, not the format's): with cost[j] = gap-stream bytes through entry j +
    values through entry j, a segment starting at entry s ends before the first j whose cost exceeds
    cost[s-1] + budget (it counts the unstored gap into s, so it is at most one gap short of full). The
    compiled :func:`kernels.gap_segments` does all this in one pass; the numpy code below gives the same.
    When few gaps need more than one byte (densities above ~3%), the stream is the gaps' low bytes with the
    few continuation bytes inserted, and offsets come from the cumulative extra bytes of those few.
    """
    fast = kernels.gap_segments(idx, itemsize, budget, scratch)
    if fast is not None:
        return fast
    n = idx.size
    if n and int(idx[-1]) < 2**32:  # real tensors: 32-bit gaps halve the memory traffic of the passes below
        gaps = np.empty(n - 1, np.uint32)
        np.subtract(idx[1:], idx[:-1], out=gaps, casting="unsafe")
    else:
        gaps = np.diff(idx).astype(np.uint64)
    big = np.flatnonzero(gaps >= 0x80)
    if big.size * 8 <= gaps.size:
        stream = gaps.astype(np.uint8)
        extra_cum = np.zeros(1, np.int64)
        if big.size:
            bv = gaps[big].astype(np.uint64)
            stream[big] = (bv & np.uint64(0x7F)).astype(np.uint8) | np.uint8(0x80)
            rest = bv >> np.uint64(7)
            rest_len = leb128.encoded_lengths(rest)
            rest_bytes = np.frombuffer(leb128.encode(rest, rest_len), np.uint8)
            stream = np.insert(stream, np.repeat(big + 1, rest_len), rest_bytes)
            extra_cum = np.concatenate([extra_cum, np.cumsum(rest_len, dtype=np.int64)])

        def starts(g: int) -> int:  # offset of gap g (g == len(gaps): the end)
            return g + int(extra_cum[np.searchsorted(big, g, side="left")])

    else:
        lengths = leb128.encoded_lengths(gaps)
        stream = np.frombuffer(leb128.encode(gaps, lengths), np.uint8)
        ends = np.zeros(n, dtype=np.int64)
        np.cumsum(lengths, out=ends[1:])

        def starts(g: int) -> int:
            return int(ends[g])

    def cost(j: int) -> int:  # bytes through entry j (gap stream through gap j-1, values through entry j)
        return starts(j) + (j + 1) * itemsize

    bounds = [0]
    while bounds[-1] < n:  # one binary search per segment (cost is strictly increasing)
        s = bounds[-1]
        limit = (cost(s - 1) if s else 0) + budget
        a, b = s + 1, n  # the answer: the first j in [a, n) with cost(j) > limit, else n
        while a < b:
            m = (a + b) // 2
            if cost(m) > limit:
                b = m
            else:
                a = m + 1
        bounds.append(a)
    return stream, bounds, [(starts(s), starts(e - 1)) for s, e in itertools.pairwise(bounds)]
