"""Vectorised unsigned LEB128 and the sorted-index stream built on it.

LEB128: 7 bits per byte, least significant group first, high bit set on every byte but the last
(198 -> C6 01). Values are unsigned 64-bit, so an encoding is 1..10 bytes. Encodings are canonical
(no redundant trailing zero groups); the decoder rejects non-canonical ones so that every index set
has exactly one byte representation.

No per-element Python loops: loops below run over byte positions (at most 10), each step one numpy
operation over all values. Dense deltas (every gap < 128) take a one-byte fast path in both directions.
"""

from __future__ import annotations

import numpy as np

from .errors import FormatError

MAX_LEB_BYTES = 10
_U64 = np.dtype("<u8")
_SEVEN = [np.uint64(7 * k) for k in range(MAX_LEB_BYTES)]


def _width(vmax: int) -> int:
    """Bytes of the LEB128 encoding of ``vmax`` (the longest encoding in an array)."""
    return max(1, -(-int(vmax).bit_length() // 7))


def encoded_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes each value takes in LEB128 (uint8 array, 1..10)."""
    v = np.asarray(values, dtype=_U64).reshape(-1)
    n = np.ones(v.shape, dtype=np.uint8)
    if v.size:
        for k in range(1, _width(int(v.max()))):
            n += v >= (np.uint64(1) << _SEVEN[k])
    return n


def encode_int(value: int) -> bytes:
    """LEB128 of one unsigned integer below 2^64 (what :func:`encode` gives for a one-element array, without
    numpy's per-call cost: the encoder writes one per segment, the segment's first position)."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"LEB128 value out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode(values: np.ndarray, lengths: np.ndarray | None = None) -> bytes:
    """LEB128-encode each value of a uint64 array, concatenated (``lengths``: encoded_lengths, if known)."""
    v = np.asarray(values, dtype=_U64).reshape(-1)
    if v.size == 0:
        return b""
    width = _width(int(v.max()))
    if width == 1:  # fast path: every value is one byte
        return v.astype(np.uint8).tobytes()
    n = encoded_lengths(v) if lengths is None else lengths
    ends = np.cumsum(n, dtype=np.int64)
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    starts = ends - n
    # Byte k of every value that is longer than k: group k, continuation bit if more bytes follow.
    out[starts] = (v & np.uint64(0x7F)).astype(np.uint8) | ((n > 1).view(np.uint8) << np.uint8(7))
    sel = np.flatnonzero(n > 1)
    for k in range(1, width):
        sn = n[sel]
        group = ((v[sel] >> _SEVEN[k]) & np.uint64(0x7F)).astype(np.uint8)
        out[starts[sel] + k] = group | ((sn > k + 1).view(np.uint8) << np.uint8(7))
        sel = sel[sn > k + 1]
    return out.tobytes()


def decode(data: bytes | memoryview | np.ndarray, count: int | None = None) -> np.ndarray:
    """Decode a concatenation of LEB128 numbers into a uint64 array.

    Raises FormatError on a number cut at the end, longer than 10 bytes, over 2^64-1, non-canonical,
    or when ``count`` is given and differs from the number of values found.
    """
    b = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    if b.size == 0:
        if count:
            raise FormatError(f"index stream empty, expected {count} values")
        return np.empty(0, dtype=_U64)
    if b[-1] & 0x80:
        raise FormatError("index stream ends inside a LEB128 number")
    if int(b.max()) < 0x80:  # every number is one byte
        if count is not None and b.size != count:
            raise FormatError(f"index stream holds {b.size} values, header says {count}")
        return b.astype(_U64)
    ends = np.flatnonzero(b < 0x80)  # the last byte of every number
    if count is not None and ends.size != count:
        raise FormatError(f"index stream holds {ends.size} values, header says {count}")
    lengths = np.empty_like(ends)
    lengths[0] = ends[0] + 1
    np.subtract(ends[1:], ends[:-1], out=lengths[1:])
    maxlen = int(lengths.max())
    if maxlen > MAX_LEB_BYTES:
        raise FormatError("LEB128 number longer than 10 bytes")
    last = b[ends]
    multi = lengths > 1
    if bool((last[multi] == 0).any()):
        raise FormatError("non-canonical LEB128 (trailing zero group)")
    if maxlen == MAX_LEB_BYTES and bool((last[lengths == MAX_LEB_BYTES] > 1).any()):
        raise FormatError("LEB128 number exceeds 2^64-1")
    # Horner from the most significant group (the last byte) down: out = out << 7 | next lower group.
    out = last.astype(_U64)
    idx = np.flatnonzero(multi)
    k = 1
    while idx.size:
        group = (b[ends[idx] - k] & 0x7F).astype(_U64)
        out[idx] = (out[idx] << _SEVEN[1]) | group
        idx = idx[lengths[idx] > k + 1]
        k += 1
    return out


def encode_indices(indices: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Sorted, unique positions -> (first absolute then gaps as LEB128, per-entry byte lengths)."""
    idx = np.asarray(indices, dtype=_U64).reshape(-1)
    gaps = np.empty_like(idx)
    if idx.size:
        gaps[0] = idx[0]
        np.subtract(idx[1:], idx[:-1], out=gaps[1:])
    return encode(gaps), encoded_lengths(gaps)


def decode_indices(data: bytes | memoryview | np.ndarray, count: int, limit: int) -> np.ndarray:
    """Index stream -> strictly increasing int64 positions, each < ``limit`` (the element count, <= 2^63).

    Raises FormatError when a gap after the first is zero (unsorted or duplicate) or a position is out
    of range.
    """
    b = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    if count and b.size == count and int(b.max()) < 0x80:
        # Dense fast path: every number one byte; never widen before the running sum.
        if count > 1 and not bool(b[1:].all()):
            raise FormatError("indices not strictly increasing (zero gap)")
        pos = np.cumsum(b, dtype=np.int64)
        if int(pos[-1]) >= limit:
            raise FormatError(f"index {int(pos[-1])} out of range for {limit} elements")
        return pos
    gaps = decode(b, count)
    if gaps.size == 0:
        return np.empty(0, dtype=np.int64)
    if gaps.size > 1 and not bool(gaps[1:].all()):
        raise FormatError("indices not strictly increasing (zero gap)")
    gmax = int(gaps.max())
    if gmax >= limit:
        raise FormatError(f"index out of range for {limit} elements")
    pos = np.cumsum(gaps, dtype=_U64)
    # A uint64 running sum can only wrap when count * max gap reaches 2^64; its first wrap shows as a
    # decrease, so check monotonicity only then (never for real tensors).
    if gaps.size * gmax >= 2**64 and not bool((pos[1:] > pos[:-1]).all()):
        raise FormatError(f"index out of range for {limit} elements")
    if int(pos[-1]) >= limit:
        raise FormatError(f"index {int(pos[-1])} out of range for {limit} elements")
    return pos.view(np.int64)
