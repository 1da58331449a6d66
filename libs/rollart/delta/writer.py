"""Sealing per-tensor changes into segments: :class:`DeltaWriter` (layouts, codings, v3 records, trailer).

Invariant: every segment yielded is at most ``max_segment_bytes`` and final (``h(v)`` accumulates over the
yielded bytes in order); positions are ascending and unique, and a tensor's records are consecutive. The
choice of layout and coding is the encoder's (docs/delta-format.md, "Encoder choices"); the bytes are
deterministic for given inputs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from . import dtypes as dt
from . import leb128, streams
from . import records as rc
from . import segment as sg
from .extract import _gap_stream
from .scratch import Scratch

# v2: below this changed fraction a sparse encoding is always smaller than a dense one.
DENSE_CANDIDATE_FRACTION = 0.25
# v3 codes values against the base: a dense XOR run of a sparsely changed tensor is mostly zero bytes and
# codes small, so dense is considered from a lower fraction, and chosen without finding the positions at all
# when a sample of the tensor says most of it changed.
DENSE_CANDIDATE_FRACTION_V3 = 0.125
DENSE_DIRECT_FRACTION = 0.45
_SAMPLE_ENTRIES = 1 << 16  # entries whose coded size predicts the sparse-vs-dense choice
PROBE_ELEMENTS = 1 << 12  # elements per member compared to estimate the changed fraction


def _dense_looks_smaller(idx: np.ndarray, vals: np.ndarray, flat: np.ndarray) -> bool:
    """Sparse or dense, predicted from the coded sizes of a deterministic sample (the first entries and the
    run of the tensor they span), so that only the chosen encoding of the whole tensor is built. ``vals``
    and ``flat`` are what the two layouts would store (new bits, or XOR with the base)."""
    k = min(idx.size, _SAMPLE_ENTRIES)
    first, last = int(idx[0]), int(idx[k - 1])
    gaps = np.diff(idx[:k]).astype(np.uint64)
    index = leb128.encode(np.concatenate([idx[:1].astype(np.uint64), gaps]))
    sparse_per_entry = (len(streams.code_index(index)[1]) + len(streams.code_values(vals[:k])[1])) / k
    run = flat[first : last + 1]
    dense_per_element = len(streams.code_values(run)[1]) / run.size
    return dense_per_element * flat.size < sparse_per_entry * idx.size


@dataclass
class TensorStats:
    name: str
    dtype: str
    numel: int
    entries: int = 0  # changed positions (dense segments: elements covered)
    segments: int = 0  # segments (v3: records) holding the tensor
    index_bytes: int = 0  # as stored
    value_bytes: int = 0  # as stored
    dense_segments: int = 0


def _check_u64(name: str, value: int) -> int:
    if not isinstance(value, int) or not 0 <= value <= sg.U64_MAX:
        raise ValueError(f"{name} must be an integer in [0, 2^64): {value!r}")
    return value


@dataclass
class _Part:
    """One record's payload before sealing."""

    layout: int
    entries: int
    start: int
    index_coding: int
    index_stream: bytes | memoryview
    value_coding: int
    value_stream: bytes | memoryview
    transform: int = rc.TRANSFORM_NONE

    @property
    def nbytes(self) -> int:
        return len(self.index_stream) + len(self.value_stream)


class DeltaWriter:
    """Turns per-tensor (positions, values) into sealed segments, then the trailer.

    Use it directly when positions are computed elsewhere (for example on the trainer's device);
    :class:`DeltaEncoder` drives it from two weight sets. Every segment is yielded as soon as it is
    sealed; ``h(v)`` accumulates over the yielded bytes.

    ``format_version`` 3 (the default) and 2 need ``base_hash`` = h(v-1), named in every segment; streams
    are Zstandard-coded when smaller, and (through :meth:`add_tensor`'s ``dense``) a tensor is stored densely
    when that is smaller. Version 3 also codes values as XOR with the base when :meth:`add_tensor` gets
    ``base``, and with ``pack=True`` packs consecutive tensors' records into shared segments: then call
    :meth:`flush` (a generator) before :meth:`trailer`. Version 1 writes the original raw sparse format.
    Output is deterministic.
    """

    def __init__(
        self,
        *,
        job: str,
        version: int,
        base_version: int,
        key: bytes,
        max_segment_bytes: int = sg.DEFAULT_MAX_SEGMENT_BYTES,
        format_version: int = sg.FORMAT_VERSION,
        base_hash: bytes | None = None,
        pack: bool = False,
    ) -> None:
        self.job = job.encode("utf-8")
        if not 1 <= len(self.job) <= sg.MAX_JOB_BYTES:
            raise ValueError(f"job id must be 1..{sg.MAX_JOB_BYTES} UTF-8 bytes")
        self.version = _check_u64("version", version)
        self.base_version = _check_u64("base_version", base_version)
        if base_version >= version:
            raise ValueError(f"base version {base_version} must be below version {version}")
        if not isinstance(key, bytes | bytearray) or not key:
            raise ValueError("job key must be non-empty bytes")
        if not 256 <= max_segment_bytes <= 0xFFFFFFFF:
            raise ValueError("max_segment_bytes must be in [256, 2^32)")
        if format_version not in sg.SUPPORTED_VERSIONS:
            raise ValueError(f"format_version must be one of {sg.SUPPORTED_VERSIONS}")
        if format_version != sg.FORMAT_V1:
            if not isinstance(base_hash, bytes | bytearray) or len(base_hash) != sg.HASH_BYTES:
                raise ValueError(f"format version {format_version} needs base_hash: the 32-byte h(v-1) of the base")
            base_hash = bytes(base_hash)
        else:
            base_hash = None
        self.format_version = format_version
        self.base_hash = base_hash
        self.key = bytes(key)
        self.max_segment_bytes = max_segment_bytes
        self.pack = pack and format_version == sg.FORMAT_V3
        self._sha = hashlib.sha256()
        self.segment_count = 0
        self.total_entries = 0
        self.total_bytes = 0
        self.tensors: dict[str, TensorStats] = {}
        self._busy = False
        self._pending: list[tuple[bytes, bytes | memoryview, bytes | memoryview]] = []  # v3 records not sealed
        self._pending_bytes = 0
        self._pending_entries = 0
        self.hash: bytes | None = None  # h(v), set by trailer()
        # DeltaEncoder's work buffers: a tensor's intermediates are done with once its segments are sealed.
        self._scratch: Scratch | None = None

    def _start(self, name: str, dtype: str, shape: tuple[int, ...]) -> tuple[dt.DType, tuple[int, ...], int, bytes]:
        if self.hash is not None:
            raise RuntimeError("writer already finished")
        if name in self.tensors:
            raise ValueError(f"tensor {name!r} added twice")
        d = dt.by_name(dtype)
        shape = tuple(int(x) for x in shape)
        numel = 1
        for s in shape:
            numel *= s
        bname = name.encode("utf-8")
        if not 1 <= len(bname) <= sg.MAX_NAME_BYTES or len(shape) > sg.MAX_NDIM:
            raise ValueError(f"bad tensor name or ndim: {name!r}")
        return d, shape, numel, bname

    def _overhead(self, bname: bytes, ndim: int) -> int:
        """Bytes of a segment holding one record of this tensor that are not its streams (at most)."""
        if self.format_version == sg.FORMAT_V3:
            return sg.v3_overhead(self.job) + 5 + rc.max_header_bytes(bname, ndim)
        return sg.data_overhead(self.job, bname, ndim, self.format_version)

    def add_tensor(
        self,
        name: str,
        dtype: str,
        shape: tuple[int, ...],
        indices: np.ndarray,
        values: np.ndarray,
        dense: Callable[[], np.ndarray] | None = None,
        *,
        base: Callable[[np.ndarray | None], np.ndarray] | None = None,
        _extracted: bool = False,
        _xor_dense: Callable[[], np.ndarray] | None = None,
        _values_xor: bool = False,
    ) -> Iterator[bytes]:
        """Segments for one tensor: ``indices`` ascending unique flat positions, ``values`` their new bits.

        ``dense`` (versions 2 and 3): returns the whole new tensor, flat; when given and enough of the tensor
        changed, the dense layout is considered and the smaller of the two is written. ``base`` (version 3):
        the base tensor's bits at the given flat positions (``None``: the whole flat tensor); values are then
        stored as XOR with them. (``_extracted``: the positions come from :func:`extract_tensor`, so they are
        not checked again; ``_xor_dense``: the whole XOR flat, built by the caller; ``_values_xor``: ``values``
        are already XOR with the base, ``base`` is then used for the dense layout only.)
        """
        d, shape, numel, bname = self._start(name, dtype, shape)
        idx = np.asarray(indices).reshape(-1)
        vals = np.ascontiguousarray(values).reshape(-1)
        if vals.dtype.itemsize != d.itemsize or vals.size != idx.size:
            raise ValueError(f"{name}: {vals.size} values of {vals.dtype} do not fit {idx.size} {dtype} positions")
        vals = vals.view(d.raw)
        ordered = _extracted or bool((idx[1:] > idx[:-1]).all())
        if idx.size and (int(idx[0]) < 0 or int(idx[-1]) >= numel or not ordered):
            raise ValueError(f"{name}: positions must be ascending, unique and within {numel}")
        stats = TensorStats(name, d.name, numel)
        self.tensors[name] = stats
        if idx.size == 0:
            return
        if d.name == "BOOL" and bool((vals > 1).any()):
            raise ValueError(f"{name}: BOOL values must be 0 or 1")
        overhead = self._overhead(bname, len(shape))
        budget = self.max_segment_bytes - overhead - leb128.MAX_LEB_BYTES
        if budget < d.itemsize + leb128.MAX_LEB_BYTES:  # any single entry must fit, or splitting stalls
            raise ValueError(f"max_segment_bytes {self.max_segment_bytes} too small for tensor {name!r}")
        v3 = self.format_version == sg.FORMAT_V3
        transform = rc.TRANSFORM_NONE
        if v3 and base is not None:
            if not _values_xor:
                vals = np.bitwise_xor(vals, np.asarray(base(idx)).reshape(-1).view(d.raw))
            transform = rc.TRANSFORM_XOR
        parts: list[_Part] | None = None
        flat = None
        dense_budget = self.max_segment_bytes - overhead
        fraction = DENSE_CANDIDATE_FRACTION_V3 if v3 else DENSE_CANDIDATE_FRACTION
        if self.format_version != sg.FORMAT_V1 and dense is not None and idx.size >= fraction * numel:
            flat = self._dense_source(d, numel, dense, base if transform else None, _xor_dense)
            if _dense_looks_smaller(idx, vals, flat):
                parts = self._dense_parts(flat, d, dense_budget, transform)
        if parts is None:
            parts = self._sparse_parts(idx, vals, d, budget, transform)
            # The estimate is a sample: never let the sparse encoding exceed the raw dense tensor.
            size = sum(p.nbytes + overhead for p in parts)
            if flat is not None and size > numel * d.itemsize:
                alt = self._dense_parts(flat, d, dense_budget, transform)
                if sum(p.nbytes + overhead for p in alt) < size:
                    parts = alt
        yield from self._emit(bname, d, shape, numel, parts, stats)

    def add_dense(
        self, name: str, dtype: str, shape: tuple[int, ...], flat: np.ndarray, *, xor: bool
    ) -> Iterator[bytes]:
        """Version 2 or 3: the whole tensor in dense records, ``flat`` its new bits or (v3, ``xor``) their XOR with
        the base's; for a tensor known to have changed almost everywhere (no positions are computed)."""
        d, shape, numel, bname = self._start(name, dtype, shape)
        if self.format_version == sg.FORMAT_V1 or (xor and self.format_version != sg.FORMAT_V3):
            raise ValueError(f"format version {self.format_version} cannot store {'XOR ' if xor else ''}dense values")
        flat = np.ascontiguousarray(flat).reshape(-1).view(d.raw)
        if flat.size != numel:
            raise ValueError(f"{name}: dense values hold {flat.size} elements, not {numel}")
        stats = TensorStats(name, d.name, numel)
        self.tensors[name] = stats
        if numel == 0:
            return
        budget = self.max_segment_bytes - self._overhead(bname, len(shape))
        parts = self._dense_parts(flat, d, budget, rc.TRANSFORM_XOR if xor else rc.TRANSFORM_NONE)
        yield from self._emit(bname, d, shape, numel, parts, stats)

    def _dense_source(
        self, d: dt.DType, numel: int, dense: Callable[[], np.ndarray], base: Callable[[np.ndarray | None], np.ndarray]
        | None, xor_dense: Callable[[], np.ndarray] | None,
    ) -> np.ndarray:  # fmt: skip
        if base is not None:
            if xor_dense is not None:
                flat = np.asarray(xor_dense()).reshape(-1).view(d.raw)
            else:
                new = np.ascontiguousarray(dense()).reshape(-1).view(d.raw)
                flat = np.bitwise_xor(new, np.ascontiguousarray(base(None)).reshape(-1).view(d.raw))
        else:
            flat = np.ascontiguousarray(dense()).reshape(-1).view(d.raw)
        if flat.size != numel:
            raise ValueError(f"dense values hold {flat.size} elements, not {numel}")
        return flat

    def _sparse_parts(
        self, idx: np.ndarray, vals: np.ndarray, d: dt.DType, budget: int, transform: int = rc.TRANSFORM_NONE
    ) -> list[_Part]:
        # Each segment stores its first position absolute (at most 10 bytes: the reserve taken off
        # `budget`) and then the gaps to the following positions (gap g belongs to entry g+1: segment [s, e)
        # takes gaps s .. e-2, its slice (lo, hi) of the stream). Segments are cut by their raw size; coding
        # can only make them smaller.
        stream, bounds, slices = _gap_stream(idx, d.itemsize, budget, self._scratch)
        coded = self.format_version != sg.FORMAT_V1
        parts = []
        for p, (lo, hi) in enumerate(slices):
            s, e = bounds[p], bounds[p + 1]
            index_stream = leb128.encode_int(int(idx[s])) + stream[lo:hi].tobytes()
            seg_vals = vals[s:e]
            if coded:
                ic, index_stream = streams.code_index(index_stream)
                vc, value_stream = streams.code_values(seg_vals, self._scratch)
            else:
                ic, vc, value_stream = sg.CODING_RAW, sg.CODING_RAW, seg_vals.data.cast("B")
            parts.append(_Part(sg.LAYOUT_SPARSE, e - s, 0, ic, index_stream, vc, value_stream, transform))
        return parts

    def _dense_parts(
        self, flat: np.ndarray, d: dt.DType, budget: int, transform: int = rc.TRANSFORM_NONE
    ) -> list[_Part]:
        per = max(1, budget // d.itemsize)
        parts = []
        for s in range(0, flat.size, per):
            chunk = flat[s : s + per]
            vc, value_stream = streams.code_values(chunk, self._scratch)
            parts.append(_Part(sg.LAYOUT_DENSE, chunk.size, s, sg.CODING_RAW, b"", vc, value_stream, transform))
        return parts

    def _emit(
        self, bname: bytes, d: dt.DType, shape: tuple[int, ...], numel: int, parts: list[_Part], stats: TensorStats
    ) -> Iterator[bytes]:
        self._busy = True
        try:
            for k, p in enumerate(parts):
                stats.entries += p.entries
                stats.segments += 1
                stats.dense_segments += p.layout == sg.LAYOUT_DENSE
                stats.index_bytes += len(p.index_stream)
                stats.value_bytes += len(p.value_stream)
                if self.format_version == sg.FORMAT_V3:
                    yield from self._add_record(bname, d, shape, k, len(parts), p)
                    continue
                seg = sg.build_data(
                    key=self.key,
                    job=self.job,
                    version=self.version,
                    base_version=self.base_version,
                    seq=self.segment_count,
                    name=bname,
                    dtype=d,
                    shape=shape,
                    numel=numel,
                    part=k,
                    parts=len(parts),
                    entries=p.entries,
                    index_stream=p.index_stream,
                    values=p.value_stream,
                    fmt=self.format_version,
                    base_hash=self.base_hash,
                    layout=p.layout,
                    index_coding=p.index_coding,
                    value_coding=p.value_coding,
                    start=p.start,
                )
                yield self._sealed(seg, p.entries)
            if not self.pack:
                yield from self.flush()
        finally:
            self._busy = False

    def _sealed(self, seg: bytes, entries: int) -> bytes:
        self._sha.update(seg)
        self.segment_count += 1
        self.total_entries += entries
        self.total_bytes += len(seg)
        return seg

    def _add_record(
        self, bname: bytes, d: dt.DType, shape: tuple[int, ...], part: int, parts: int, p: _Part
    ) -> Iterator[bytes]:
        """Append a v3 record to the open segment, sealing that segment first when the record would not fit."""
        head = rc.header(
            name=bname, dtype=d, shape=shape, part=part, parts=parts, layout=p.layout, index_coding=p.index_coding,
            value_coding=p.value_coding, transform=p.transform, entries=p.entries, start=p.start,
            index_bytes=len(p.index_stream), value_bytes=len(p.value_stream),
        )  # fmt: skip
        size = len(head) + p.nbytes
        count = len(self._pending) + 1
        if (
            self._pending
            and sg.v3_overhead(self.job) + len(rc.leb(count)) + self._pending_bytes + size > self.max_segment_bytes
        ):
            yield from self.flush()
        # A raw stream may be a view of the scratch buffers, which the next tensor reuses: keep a copy.
        index = p.index_stream if isinstance(p.index_stream, bytes) else bytes(p.index_stream)
        values = p.value_stream if isinstance(p.value_stream, bytes) else bytes(p.value_stream)
        self._pending.append((head, index, values))
        self._pending_bytes += size
        self._pending_entries += p.entries

    def flush(self) -> Iterator[bytes]:
        """Seal the open v3 segment, if any (with ``pack=True``: before :meth:`trailer`)."""
        if not self._pending:
            return
        seg = sg.build_v3(
            key=self.key,
            job=self.job,
            version=self.version,
            base_version=self.base_version,
            seq=self.segment_count,
            base_hash=self.base_hash,  # type: ignore[arg-type]
            records=self._pending,
        )
        entries = self._pending_entries
        self._pending, self._pending_bytes, self._pending_entries = [], 0, 0
        yield self._sealed(seg, entries)

    def add_anchor(self, name: str, dtype: str, shape: tuple[int, ...], value: np.ndarray) -> Iterator[bytes]:
        """Versions 2 and 3, nothing changed: one entry re-setting element 0 of ``name`` to its current
        ``value`` (v3: XOR 0 with the base).

        Set semantics make it a no-op, and it gives the delta a data segment, so ``h(v)`` (over the data
        segments) still covers ``h(v-1)`` and the hash chain continues through an unchanged version.
        """
        if self.segment_count or self._pending:
            raise RuntimeError("the delta already has data segments")
        self.tensors.pop(name, None)
        value = np.asarray(value).reshape(1)
        if self.format_version == sg.FORMAT_V3:
            return self.add_tensor(name, dtype, shape, np.zeros(1, np.int64), value, base=lambda _: value)
        return self.add_tensor(name, dtype, shape, np.zeros(1, np.int64), value)

    def trailer(self) -> bytes:
        """The trailer segment; call after every tensor's segments were consumed (and :meth:`flush`)."""
        if self._busy:
            raise RuntimeError("a tensor's segments were not all consumed")
        if self._pending:
            raise RuntimeError("records are still open: consume flush() before the trailer")
        if self.hash is not None:
            raise RuntimeError("trailer already produced")
        if self.format_version != sg.FORMAT_V1 and self.segment_count == 0:
            raise RuntimeError(
                f"a version-{self.format_version} delta needs a data segment: add_anchor() when nothing changed"
            )
        self.hash = self._sha.digest()
        seg = sg.build_trailer(
            key=self.key,
            job=self.job,
            version=self.version,
            base_version=self.base_version,
            segment_count=self.segment_count,
            tensor_count=sum(1 for t in self.tensors.values() if t.entries),
            total_entries=self.total_entries,
            digest=self.hash,
            fmt=self.format_version,
            base_hash=self.base_hash,
        )
        self.total_bytes += len(seg)
        return seg
