"""Byte layout of one segment: building, framing and verified parsing (docs/delta-format.md).

All integers little-endian. A segment is
    common header | kind-specific body | CRC-32 (u32) | HMAC-SHA256 (32 bytes)
The CRC-32 (IEEE 802.3 polynomial, zlib's) covers every byte before it and tells corruption apart from
forgery; the HMAC (job key) covers every byte before it, CRC included.

Format versions 1, 2 and 3 share the first 34 + job_len bytes of the header (so framing and relays need
not know which one a segment is). Version 2 adds the base identity ``h(v-1)`` after the job id and, in data
segments, a layout (sparse or dense) and a coding per stream (raw or one Zstandard frame). Version 3 keeps
version 2's header and trailer; its data body is a list of tensor records (:mod:`.records`).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from . import dtypes as dt
from . import records as rc
from .errors import AuthError, ChecksumError, FormatError, TruncatedError, UnsupportedVersionError

MAGIC = b"RDLT"
FORMAT_V1 = 1
FORMAT_V2 = 2
FORMAT_V3 = 3
SUPPORTED_VERSIONS = (FORMAT_V1, FORMAT_V2, FORMAT_V3)
FORMAT_VERSION = FORMAT_V3  # what encoders write unless told otherwise
KIND_DATA = 1
KIND_TRAILER = 2
LAYOUT_SPARSE = 1  # v2: positions + values
LAYOUT_DENSE = 2  # v2: every element of [start, start + entries)
CODING_RAW = 0
CODING_ZSTD = 1  # v2: the stream is one Zstandard frame (values: byte planes)
HASH_BYTES = 32
DEFAULT_MAX_SEGMENT_BYTES = 4 * 1024 * 1024
MAX_JOB_BYTES = 1024
MAX_NAME_BYTES = 4096
MAX_NDIM = 64
MAX_NUMEL = 2**63  # positions must fit a signed 64-bit index
U64_MAX = 2**64 - 1

_COMMON = struct.Struct("<4sHBBIIQQH")  # magic, format, kind, flags, length, seq, version, base, job_len
_NAME = struct.Struct("<H")
_DT = struct.Struct("<BB")  # dtype code, ndim
_DATA_TAIL = struct.Struct("<QIIQQQ")  # v1: numel, part, parts, entries, index_bytes, value_bytes
# v2: numel, part, parts, layout, index_coding, value_coding, reserved, entries, start, index_bytes, value_bytes
_DATA_TAIL_V2 = struct.Struct("<QIIBBBBQQQQ")
_TRAILER = struct.Struct("<IIQ32s")  # segment_count, tensor_count, total_entries, h(v)
_CRC = struct.Struct("<I")
MAC_BYTES = 32
FOOTER_BYTES = _CRC.size + MAC_BYTES
MIN_SEGMENT_BYTES = _COMMON.size + 1 + FOOTER_BYTES


@dataclass(frozen=True)
class Segment:
    """A parsed, verified segment. ``index``/``values`` locate the streams inside ``raw`` (data only)."""

    raw: bytes | bytearray | memoryview
    kind: int
    seq: int
    job: str
    version: int
    base_version: int
    format_version: int = FORMAT_V1
    base_hash: bytes | None = None  # v2: h(v-1), the identity of the weights the delta applies to
    # data segments
    name: str = ""
    dtype: dt.DType | None = None
    shape: tuple[int, ...] = ()
    numel: int = 0
    part: int = 0
    parts: int = 0
    entries: int = 0
    index_start: int = 0
    index_bytes: int = 0
    value_bytes: int = 0
    layout: int = LAYOUT_SPARSE
    index_coding: int = CODING_RAW
    value_coding: int = CODING_RAW
    start: int = 0  # dense: first flat position covered
    records: tuple[rc.Record, ...] = ()  # v3: the tensor records (v1/v2: see tensor_records)
    # trailer
    segment_count: int = 0
    tensor_count: int = 0
    total_entries: int = 0
    hash: bytes = b""

    @property
    def is_trailer(self) -> bool:
        return self.kind == KIND_TRAILER

    @property
    def is_dense(self) -> bool:
        return self.layout == LAYOUT_DENSE

    @property
    def tensor_records(self) -> tuple[rc.Record, ...]:
        """The segment's tensor records: v3 its list, v1/v2 the one tensor its fixed header describes."""
        if self.records or self.is_trailer:
            return self.records
        assert self.dtype is not None
        return (
            rc.Record(self.raw, self.seq, self.name, self.dtype, self.shape, self.numel, self.part, self.parts,
                      self.layout, self.index_coding, self.value_coding, rc.TRANSFORM_NONE, self.entries, self.start,
                      self.index_start, self.index_bytes, self.value_bytes),
        )  # fmt: skip

    @property
    def index_view(self) -> memoryview:
        return memoryview(self.raw)[self.index_start : self.index_start + self.index_bytes]

    @property
    def value_view(self) -> memoryview:
        s = self.index_start + self.index_bytes
        return memoryview(self.raw)[s : s + self.value_bytes]


def mac(key: bytes, data: bytes | bytearray | memoryview) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def _common(
    kind: int, length: int, seq: int, job: bytes, version: int, base_version: int, fmt: int, base_hash: bytes | None
) -> bytes:
    head = _COMMON.pack(MAGIC, fmt, kind, 0, length, seq, version, base_version, len(job)) + job
    if fmt == FORMAT_V1:
        return head
    if base_hash is None or len(base_hash) != HASH_BYTES:
        raise ValueError(f"a version-{fmt} segment needs the 32-byte base hash h(v-1)")
    return head + base_hash


def _header_bytes(job: bytes, fmt: int) -> int:
    return _COMMON.size + len(job) + (HASH_BYTES if fmt != FORMAT_V1 else 0)


def v3_overhead(job: bytes) -> int:
    """Bytes of a v3 data segment outside its records, but for the record count (LEB128, 1-5 bytes)."""
    return _header_bytes(job, FORMAT_V3) + FOOTER_BYTES


def build_v3(
    *,
    key: bytes,
    job: bytes,
    version: int,
    base_version: int,
    seq: int,
    base_hash: bytes,
    records: list[tuple[bytes, bytes | memoryview, bytes | memoryview]],
) -> bytes:
    """A v3 data segment from ``(record header, index stream, value stream)`` triples, in order."""
    count = rc.leb(len(records))
    length = v3_overhead(job) + len(count) + sum(len(h) + len(i) + len(v) for h, i, v in records)
    if length > 0xFFFFFFFF:
        raise ValueError("segment longer than 2^32-1 bytes")
    head = _common(KIND_DATA, length, seq, job, version, base_version, FORMAT_V3, base_hash) + count
    pieces: list[bytes | memoryview] = [head]
    for h, i, v in records:
        pieces += (h, i, v)
    crc = 0
    mac_ = hmac.new(key, digestmod=hashlib.sha256)
    for p in pieces:
        crc = zlib.crc32(p, crc)
        mac_.update(p)
    tail = _CRC.pack(crc)
    mac_.update(tail)
    return b"".join([*pieces, tail, mac_.digest()])


def data_overhead(job: bytes, name: bytes, ndim: int, fmt: int = FORMAT_V1) -> int:
    """Bytes of a data segment that are not index or value stream."""
    tail = _DATA_TAIL_V2.size if fmt == FORMAT_V2 else _DATA_TAIL.size
    return _header_bytes(job, fmt) + _NAME.size + len(name) + _DT.size + 8 * ndim + tail + FOOTER_BYTES


def _seal(buf: bytearray, key: bytes) -> bytes:
    buf += _CRC.pack(zlib.crc32(buf))
    buf += mac(key, buf)
    return bytes(buf)


def build_data(
    *,
    key: bytes,
    job: bytes,
    version: int,
    base_version: int,
    seq: int,
    name: bytes,
    dtype: dt.DType,
    shape: tuple[int, ...],
    numel: int,
    part: int,
    parts: int,
    entries: int,
    index_stream: bytes | memoryview,
    values: bytes | memoryview,
    fmt: int = FORMAT_V1,
    base_hash: bytes | None = None,
    layout: int = LAYOUT_SPARSE,
    index_coding: int = CODING_RAW,
    value_coding: int = CODING_RAW,
    start: int = 0,
) -> bytes:
    length = data_overhead(job, name, len(shape), fmt) + len(index_stream) + len(values)
    if length > 0xFFFFFFFF:
        raise ValueError("segment longer than 2^32-1 bytes")
    buf = bytearray(_common(KIND_DATA, length, seq, job, version, base_version, fmt, base_hash))
    buf += _NAME.pack(len(name)) + name
    buf += _DT.pack(dtype.code, len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
    if fmt == FORMAT_V1:
        if (layout, index_coding, value_coding, start) != (LAYOUT_SPARSE, CODING_RAW, CODING_RAW, 0):
            raise ValueError("format version 1 has raw sparse segments only")
        buf += _DATA_TAIL.pack(numel, part, parts, entries, len(index_stream), len(values))
    else:
        buf += _DATA_TAIL_V2.pack(
            numel, part, parts, layout, index_coding, value_coding, 0, entries, start, len(index_stream), len(values)
        )
    # CRC-32 and HMAC over the three pieces in turn, then one copy into the segment (not header + streams
    # into a growing buffer, then that buffer into bytes: two copies of the streams and a fresh allocation).
    crc = _CRC.pack(zlib.crc32(values, zlib.crc32(index_stream, zlib.crc32(buf))))
    h = hmac.new(key, buf, hashlib.sha256)
    h.update(index_stream)
    h.update(values)
    h.update(crc)
    return b"".join((buf, index_stream, values, crc, h.digest()))


def build_trailer(
    *,
    key: bytes,
    job: bytes,
    version: int,
    base_version: int,
    segment_count: int,
    tensor_count: int,
    total_entries: int,
    digest: bytes,
    fmt: int = FORMAT_V1,
    base_hash: bytes | None = None,
) -> bytes:
    length = _header_bytes(job, fmt) + _TRAILER.size + FOOTER_BYTES
    buf = bytearray(_common(KIND_TRAILER, length, segment_count, job, version, base_version, fmt, base_hash))
    buf += _TRAILER.pack(segment_count, tensor_count, total_entries, digest)
    return _seal(buf, key)


def peek_length(buf: bytes | memoryview, offset: int = 0) -> int:
    """Length of the segment starting at ``offset``, from its header (unverified, for framing)."""
    avail = len(buf) - offset
    if avail < 12:
        raise TruncatedError(f"segment header cut short at byte {offset} ({avail} bytes left)")
    mv = memoryview(buf)
    if bytes(mv[offset : offset + 4]) != MAGIC:
        raise FormatError(f"bad magic at byte {offset}: {bytes(mv[offset : offset + 4])!r}")
    (length,) = struct.unpack_from("<I", buf, offset + 8)
    if length < MIN_SEGMENT_BYTES:
        raise FormatError(f"segment at byte {offset} claims impossible length {length}")
    if length > avail:
        raise TruncatedError(f"segment at byte {offset} is {length} bytes but only {avail} remain")
    return length


def split(buf: bytes | memoryview) -> Iterator[memoryview]:
    """Cut a concatenation of segments (a .dseg file) into segments, by their length fields."""
    mv = memoryview(buf)
    off = 0
    while off < len(mv):
        n = peek_length(mv, off)
        yield mv[off : off + n]
        off += n


def parse(raw: bytes | bytearray | memoryview, key: bytes | None) -> Segment:
    """Verify and parse one segment (exactly one: ``raw`` must be its whole length).

    Checks, in order: magic, format version, length, CRC-32 (ChecksumError), HMAC when ``key`` is given
    (AuthError), then every field's consistency (FormatError). Bodies are not decoded here.
    """
    n = len(raw)
    if n < _COMMON.size:
        raise TruncatedError(f"segment of {n} bytes is shorter than a header")
    magic, fmt, kind, flags, length, seq, version, base, job_len = _COMMON.unpack_from(raw, 0)
    if magic != MAGIC:
        raise FormatError(f"bad magic {magic!r}")
    if fmt not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(f"format version {fmt} (this decoder reads 1, 2 and 3)")
    if length > n:
        raise TruncatedError(f"segment {seq} is {length} bytes but only {n} arrived")
    if length < n:
        raise FormatError(f"{n - length} bytes after the end of segment {seq}")
    if length < MIN_SEGMENT_BYTES:
        raise FormatError(f"impossible segment length {length}")
    mv = memoryview(raw)
    (crc,) = _CRC.unpack_from(raw, n - FOOTER_BYTES)
    if zlib.crc32(mv[: n - FOOTER_BYTES]) != crc:
        raise ChecksumError(f"segment {seq}: CRC-32 mismatch")
    if key is not None and not hmac.compare_digest(mac(key, mv[: n - MAC_BYTES]), bytes(mv[n - MAC_BYTES :])):
        raise AuthError(f"segment {seq}: HMAC does not verify under the job key")
    if flags != 0:
        raise FormatError(f"segment {seq}: unknown flags {flags:#x}")
    if kind not in (KIND_DATA, KIND_TRAILER):
        raise FormatError(f"segment {seq}: unknown kind {kind}")
    end = n - FOOTER_BYTES
    pos = _COMMON.size
    if not 1 <= job_len <= MAX_JOB_BYTES or pos + job_len > end:
        raise FormatError(f"segment {seq}: bad job id length {job_len}")
    job = _utf8(mv[pos : pos + job_len], "job id")
    pos += job_len
    base_hash = None
    if fmt != FORMAT_V1:
        if pos + HASH_BYTES > end:
            raise FormatError(f"segment {seq}: cut inside the base hash")
        base_hash = bytes(mv[pos : pos + HASH_BYTES])
        pos += HASH_BYTES
    if base >= version:
        raise FormatError(f"segment {seq}: base version {base} is not below version {version}")
    common = {
        "raw": raw,
        "kind": kind,
        "seq": seq,
        "job": job,
        "version": version,
        "base_version": base,
        "format_version": fmt,
        "base_hash": base_hash,
    }
    if kind == KIND_TRAILER:
        if pos + _TRAILER.size != end:
            raise FormatError("trailer has the wrong length")
        count, tensors, total, digest = _TRAILER.unpack_from(raw, pos)
        if count != seq:
            raise FormatError(f"trailer sequence number {seq} != its segment count {count}")
        return Segment(**common, segment_count=count, tensor_count=tensors, total_entries=total, hash=digest)
    if fmt == FORMAT_V3:
        records = rc.parse_body(raw, pos, end, seq)
        return Segment(**common, records=records, entries=sum(r.entries for r in records))
    if pos + _NAME.size > end:
        raise FormatError(f"segment {seq}: cut inside the tensor name")
    (name_len,) = _NAME.unpack_from(raw, pos)
    pos += _NAME.size
    if not 1 <= name_len <= MAX_NAME_BYTES or pos + name_len + _DT.size > end:
        raise FormatError(f"segment {seq}: bad tensor name length {name_len}")
    name = _utf8(mv[pos : pos + name_len], "tensor name")
    pos += name_len
    code, ndim = _DT.unpack_from(raw, pos)
    pos += _DT.size
    dtype = dt.by_code(code)
    if ndim > MAX_NDIM or pos + 8 * ndim + _DATA_TAIL.size > end:
        raise FormatError(f"segment {seq}: bad ndim {ndim}")
    shape = struct.unpack_from(f"<{ndim}Q", raw, pos)
    pos += 8 * ndim
    layout, index_coding, value_coding, reserved, start = LAYOUT_SPARSE, CODING_RAW, CODING_RAW, 0, 0
    if fmt == FORMAT_V1:
        numel, part, parts, entries, index_bytes, value_bytes = _DATA_TAIL.unpack_from(raw, pos)
        pos += _DATA_TAIL.size
    else:
        if pos + _DATA_TAIL_V2.size > end:
            raise FormatError(f"segment {seq}: bad ndim {ndim}")
        (numel, part, parts, layout, index_coding, value_coding, reserved, entries, start, index_bytes,
         value_bytes) = _DATA_TAIL_V2.unpack_from(raw, pos)  # fmt: skip
        pos += _DATA_TAIL_V2.size
    prod = 1
    for d in shape:
        prod *= d
    if prod != numel or not 1 <= numel <= MAX_NUMEL:
        raise FormatError(f"segment {seq} ({name}): element count {numel} does not match shape {shape}")
    if not 0 <= part < parts:
        raise FormatError(f"segment {seq} ({name}): part {part} of {parts}")
    if reserved != 0:
        raise FormatError(f"segment {seq} ({name}): reserved byte {reserved}")
    rc.check_streams(
        f"segment {seq} ({name})", layout, index_coding, value_coding, entries, numel, start,
        index_bytes, value_bytes, dtype.itemsize,
    )  # fmt: skip
    if pos + index_bytes + value_bytes != end:
        raise FormatError(f"segment {seq} ({name}): stream lengths do not add up to the segment length")
    return Segment(
        **common,
        name=name,
        dtype=dtype,
        shape=tuple(shape),
        numel=numel,
        part=part,
        parts=parts,
        entries=entries,
        index_start=pos,
        index_bytes=index_bytes,
        value_bytes=value_bytes,
        layout=layout,
        index_coding=index_coding,
        value_coding=value_coding,
        start=start,
    )


def _utf8(b: memoryview, what: str) -> str:
    try:
        return bytes(b).decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(f"{what} is not UTF-8") from None
