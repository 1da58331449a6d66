"""Index and value streams of a tensor record: coding (raw or Zstandard) and the checks on decoding.

:func:`decode_record` is the one place where streams are decoded and checked (canonical LEB128, entry
count, gaps >= 1, positions < numel, BOOL values 0/1, Zstandard frames and their window size): the stager,
and so ``decode_delta``, ``inspect_delta`` and ``rollart delta inspect|apply``, all go through it.

Version-2 coding (docs/delta-format.md): a stream with coding 1 is exactly one Zstandard frame that
declares its content size, with nothing after it. A value stream's frame holds the values' byte planes:
byte 0 of every value in entry order, then byte 1, ... (bf16: the mantissa bytes, then the sign/exponent
bytes, which are highly repetitive). The encoder uses coding 1 only when it is strictly smaller, and the
decoder insists on that, so a coded stream is never larger than the raw one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import zstandard

from . import kernels
from . import segment as sg
from .errors import FormatError
from .leb128 import MAX_LEB_BYTES, decode_indices
from .records import TRANSFORM_XOR, Record
from .scratch import Scratch

ZSTD_LEVEL = 1  # the encoder's choice (not part of the format); fixed so that re-encoding gives identical bytes
# Level 1's match finder with a 64-entry hash table (2^6, libzstd's minimum; level 1 uses 2^13): the streams are
# byte planes and LEB128 gaps, whose long matches are rare, so the big table mostly costs cache misses. On
# bf16 value planes and gap streams it is 2-2.6x faster than plain level 1 and 0-5% smaller (fewer short
# matches, more Huffman-coded literals); measured in bench/notes/weights-codec.md.
ZSTD_HASH_LOG = 6
# The largest Zstandard window a decoder must accept (docs/delta-format.md, "Zstandard frames"); larger
# windows are refused before decompressing, so a frame cannot make a decoder reserve more history memory.
MAX_WINDOW_BYTES = 1 << 23

_local = threading.local()


def _cctx() -> zstandard.ZstdCompressor:
    c = getattr(_local, "cctx", None)
    if c is None:
        # Single-threaded, content size written, no checksum (CRC-32 and HMAC cover the bytes): deterministic.
        params = zstandard.ZstdCompressionParameters.from_level(
            ZSTD_LEVEL, hash_log=ZSTD_HASH_LOG, write_content_size=True, write_checksum=False
        )
        c = _local.cctx = zstandard.ZstdCompressor(compression_params=params)
    return c


def _dctx() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
    return d


def byte_planes(values: np.ndarray, scratch: Scratch | None = None) -> np.ndarray:
    """uint8 array: byte 0 of every value, then byte 1, ... (little-endian values). With ``scratch``, a view
    of its buffer (valid until the next call with it)."""
    n, w = values.size, values.dtype.itemsize
    b = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
    if w == 1:
        return b
    out = np.empty(n * w, np.uint8) if scratch is None else scratch.array("planes", n * w, np.uint8)
    if w == 2 and kernels.byte_planes16(np.ascontiguousarray(values).reshape(-1), out):
        return out
    np.copyto(out.reshape(w, n), b.reshape(n, w).T)
    return out


def from_byte_planes(planes: np.ndarray, count: int, itemsize: int) -> np.ndarray:
    """Inverse of :func:`byte_planes`: uint8 array of the values' little-endian bytes."""
    return planes if itemsize == 1 else np.ascontiguousarray(planes.reshape(itemsize, count).T).reshape(-1)


def code_index(raw: bytes) -> tuple[int, bytes]:
    """(coding, stream) for a LEB128 index stream: a Zstandard frame only when strictly smaller."""
    z = _cctx().compress(raw)
    return (sg.CODING_ZSTD, z) if len(z) < len(raw) else (sg.CODING_RAW, raw)


def code_values(values: np.ndarray, scratch: Scratch | None = None) -> tuple[int, bytes | memoryview]:
    """(coding, stream) for values: Zstandard over byte planes only when strictly smaller than raw (then a
    view of ``values``)."""
    z = _cctx().compress(byte_planes(values, scratch).data)
    if len(z) < values.nbytes:
        return sg.CODING_ZSTD, z
    return sg.CODING_RAW, np.ascontiguousarray(values).reshape(-1).data.cast("B")


def _unzstd(stream: memoryview, lo: int, hi: int, what: str) -> np.ndarray:
    """Decompress one frame whose declared content size must lie in [lo, hi] (checked before decompressing)."""
    try:
        size = zstandard.frame_content_size(stream)
    except zstandard.ZstdError as exc:
        raise FormatError(f"{what}: not a Zstandard frame ({exc})") from None
    if size < 0:
        raise FormatError(f"{what}: the Zstandard frame does not declare its content size")
    if not lo <= size <= hi:
        raise FormatError(f"{what}: Zstandard content of {size} bytes, expected {lo}..{hi}")
    window = zstandard.get_frame_parameters(stream).window_size
    if window > MAX_WINDOW_BYTES:
        raise FormatError(
            f"{what}: Zstandard window of {window} bytes exceeds the {MAX_WINDOW_BYTES} a decoder must accept"
        )
    try:
        out = _dctx().decompress(stream, max_output_size=hi, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise FormatError(f"{what}: bad Zstandard frame ({exc})") from None
    if len(out) != size:
        raise FormatError(f"{what}: Zstandard frame decodes to {len(out)} bytes, declared {size}")
    return np.frombuffer(out, dtype=np.uint8)


@dataclass
class Payload:
    """A record's entries: ``indices`` (int64, ascending) for sparse, ``start`` for dense. With ``xor`` (v3,
    value transform 1) the values are the new bits XOR the base's at those positions."""

    indices: np.ndarray | None
    start: int
    values: np.ndarray  # numpy type of the dtype (bf16 as uint16)
    xor: bool = False

    @property
    def first(self) -> int:
        return self.start if self.indices is None else int(self.indices[0])

    @property
    def last(self) -> int:
        return self.start + self.values.size - 1 if self.indices is None else int(self.indices[-1])


def decode_payload(seg: sg.Segment) -> Payload:
    """The payload of a v1/v2 data segment (its one record)."""
    return decode_record(seg.tensor_records[0])


def decode_record(seg: Record) -> Payload:
    """Decode and check a parsed record's streams. Raises FormatError (nothing is kept on failure)."""
    what = f"segment {seg.seq} ({seg.name})"
    d = seg.dtype
    indices = None
    if not seg.is_dense:
        stream = seg.index_view
        if seg.index_coding == sg.CODING_ZSTD:
            raw = _unzstd(stream, max(seg.entries, seg.index_bytes + 1), seg.entries * MAX_LEB_BYTES, f"{what} index")
        else:
            raw = np.frombuffer(stream, dtype=np.uint8)
        try:
            indices = decode_indices(raw, seg.entries, seg.numel)
        except FormatError as exc:
            raise FormatError(f"{what}: {exc}") from None
    nbytes = seg.entries * d.itemsize
    if seg.value_coding == sg.CODING_ZSTD:
        planes = _unzstd(seg.value_view, nbytes, nbytes, f"{what} values")
        values = from_byte_planes(planes, seg.entries, d.itemsize).view(d.numpy)
    else:
        values = np.frombuffer(seg.value_view, dtype=d.numpy)
    xor = seg.transform == TRANSFORM_XOR
    if d.name == "BOOL" and bool((values.view(np.uint8) > 1).any()):  # (XOR of two BOOLs is 0 or 1 too)
        raise FormatError(f"{what}: BOOL value other than 0 or 1")
    return Payload(indices, seg.start, values, xor)
