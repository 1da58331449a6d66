"""Tensor records: the body of a format-3 data segment (docs/delta-format.md, "Data segment body (kind 1), version 3").

Invariant: a v3 data segment holds ``record_count`` (LEB128, >= 1) records back to back, each a varint header
and its two streams, ending exactly at the CRC; small tensors share a segment, large ones are split into
parts over several. Version 1 and 2 segments hold one record each, read from their fixed header
(:func:`single`), so the decoder handles every version through :class:`Record`.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import dtypes as dt
from .errors import FormatError

LAYOUT_SPARSE = 1
LAYOUT_DENSE = 2
CODING_RAW = 0
CODING_ZSTD = 1
TRANSFORM_NONE = 0  # values are the new bit patterns
TRANSFORM_XOR = 1  # v3: values are the new bit patterns XOR the base's (the base is checked before apply)
MAX_NAME_BYTES = 4096
MAX_NDIM = 64
MAX_NUMEL = 2**63
MAX_LEB_BYTES = 10
MAX_PARTS = 2**32 - 1


@dataclass(frozen=True)
class Record:
    """One tensor's entries in one segment; ``index_start`` locates its streams in ``raw``."""

    raw: bytes | bytearray | memoryview
    seq: int
    name: str
    dtype: dt.DType
    shape: tuple[int, ...]
    numel: int
    part: int
    parts: int
    layout: int
    index_coding: int
    value_coding: int
    transform: int
    entries: int
    start: int
    index_start: int
    index_bytes: int
    value_bytes: int

    @property
    def is_dense(self) -> bool:
        return self.layout == LAYOUT_DENSE

    @property
    def index_view(self) -> memoryview:
        return memoryview(self.raw)[self.index_start : self.index_start + self.index_bytes]

    @property
    def value_view(self) -> memoryview:
        s = self.index_start + self.index_bytes
        return memoryview(self.raw)[s : s + self.value_bytes]


def leb(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def header(
    *,
    name: bytes,
    dtype: dt.DType,
    shape: tuple[int, ...],
    part: int,
    parts: int,
    layout: int,
    index_coding: int,
    value_coding: int,
    transform: int,
    entries: int,
    start: int,
    index_bytes: int,
    value_bytes: int,
) -> bytes:
    """A v3 record's header (everything before its streams)."""
    out = bytearray(leb(len(name)) + name)
    out += bytes((dtype.code, len(shape)))
    for d in shape:
        out += leb(d)
    out += leb(part) + leb(parts) + bytes((layout, index_coding, value_coding, transform)) + leb(entries)
    out += leb(start) if layout == LAYOUT_DENSE else leb(index_bytes)
    out += leb(value_bytes)
    return bytes(out)


def max_header_bytes(name: bytes, ndim: int) -> int:
    """An upper bound of :func:`header`'s length for any counts (what the segment cut reserves)."""
    return 2 + len(name) + 2 + MAX_LEB_BYTES * ndim + 5 + 5 + 4 + 3 * MAX_LEB_BYTES


class _Reader:
    def __init__(self, raw: bytes | bytearray | memoryview, pos: int, end: int, what: str) -> None:
        self.mv, self.pos, self.end, self.what = memoryview(raw), pos, end, what

    def byte(self, field: str) -> int:
        if self.pos >= self.end:
            raise FormatError(f"{self.what}: cut inside {field}")
        b = self.mv[self.pos]
        self.pos += 1
        return int(b)

    def leb(self, field: str) -> int:
        value = shift = 0
        for k in range(MAX_LEB_BYTES):
            b = self.byte(field)
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                if k and b == 0:
                    raise FormatError(f"{self.what}: {field} is a non-canonical LEB128 number")
                if value > 2**64 - 1:
                    raise FormatError(f"{self.what}: {field} exceeds 2^64-1")
                return value
        raise FormatError(f"{self.what}: {field} is longer than 10 LEB128 bytes")

    def take(self, n: int, field: str) -> memoryview:
        if self.pos + n > self.end:
            raise FormatError(f"{self.what}: cut inside {field}")
        s = self.mv[self.pos : self.pos + n]
        self.pos += n
        return s


def _utf8(b: memoryview, what: str) -> str:
    try:
        return bytes(b).decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(f"{what} is not UTF-8") from None


def check_streams(
    what: str, layout: int, index_coding: int, value_coding: int, entries: int, numel: int, start: int,
    index_bytes: int, value_bytes: int, itemsize: int,
) -> None:  # fmt: skip
    """The bounds every version shares (docs/delta-format.md, the table of stored lengths)."""
    if not 1 <= entries <= numel:
        raise FormatError(f"{what}: {entries} entries for {numel} elements")
    if layout not in (LAYOUT_SPARSE, LAYOUT_DENSE):
        raise FormatError(f"{what}: unknown layout {layout}")
    if index_coding not in (CODING_RAW, CODING_ZSTD) or value_coding not in (CODING_RAW, CODING_ZSTD):
        raise FormatError(f"{what}: unknown stream coding {index_coding}/{value_coding}")
    raw_values = entries * itemsize
    if value_coding == CODING_RAW and value_bytes != raw_values:
        raise FormatError(f"{what}: value stream of {value_bytes} bytes for {entries} entries")
    if value_coding == CODING_ZSTD and not 1 <= value_bytes < raw_values:
        raise FormatError(f"{what}: compressed value stream of {value_bytes} bytes is not smaller")
    if layout == LAYOUT_DENSE:
        if index_coding != CODING_RAW or index_bytes != 0 or start + entries > numel:
            raise FormatError(f"{what}: dense range {start}+{entries} of {numel} or index stream")
    else:
        if start != 0:
            raise FormatError(f"{what}: sparse segment with start {start}")
        lo, hi = (entries, entries * 10) if index_coding == CODING_RAW else (1, entries * 10 - 1)
        if not lo <= index_bytes <= hi:
            raise FormatError(f"{what}: index stream of {index_bytes} bytes for {entries} entries")


def parse_body(raw: bytes | bytearray | memoryview, pos: int, end: int, seq: int) -> tuple[Record, ...]:
    """Parse and check a v3 data body ``raw[pos:end]`` (streams are not decoded here)."""
    r = _Reader(raw, pos, end, f"segment {seq}")
    count = r.leb("record_count")
    if not 1 <= count <= end - pos:
        raise FormatError(f"segment {seq}: record count {count}")
    out = []
    for k in range(count):
        r.what = f"segment {seq} record {k}"
        name_len = r.leb("name_len")
        if not 1 <= name_len <= MAX_NAME_BYTES:
            raise FormatError(f"{r.what}: bad tensor name length {name_len}")
        name = _utf8(r.take(name_len, "the tensor name"), "tensor name")
        r.what = f"segment {seq} record {k} ({name})"
        dtype = dt.by_code(r.byte("dtype"))
        ndim = r.byte("ndim")
        if ndim > MAX_NDIM:
            raise FormatError(f"{r.what}: bad ndim {ndim}")
        shape = tuple(r.leb("shape") for _ in range(ndim))
        numel = 1
        for d in shape:
            numel *= d
        if not 1 <= numel <= MAX_NUMEL:
            raise FormatError(f"{r.what}: element count {numel} of shape {shape} is not in 1..2^63")
        part, parts = r.leb("part"), r.leb("parts")
        if not 0 <= part < parts <= MAX_PARTS:
            raise FormatError(f"{r.what}: part {part} of {parts}")
        layout, index_coding, value_coding, transform = (r.byte(f) for f in ("layout", "coding", "coding", "transform"))
        if transform not in (TRANSFORM_NONE, TRANSFORM_XOR):
            raise FormatError(f"{r.what}: unknown value transform {transform}")
        entries = r.leb("entries")
        start = index_bytes = 0
        if layout == LAYOUT_DENSE:
            start = r.leb("start")
        else:
            index_bytes = r.leb("index_bytes")
        value_bytes = r.leb("value_bytes")
        check_streams(r.what, layout, index_coding, value_coding, entries, numel, start, index_bytes, value_bytes,
                      dtype.itemsize)  # fmt: skip
        index_start = r.pos
        r.take(index_bytes, "the index stream")
        r.take(value_bytes, "the value stream")
        out.append(
            Record(raw, seq, name, dtype, shape, numel, part, parts, layout, index_coding, value_coding, transform,
                   entries, start, index_start, index_bytes, value_bytes)
        )  # fmt: skip
    if r.pos != end:
        raise FormatError(f"segment {seq}: {end - r.pos} bytes after the last record")
    return tuple(out)
