"""Extraction, streaming encoding, staged decoding and exact application of sparse deltas.

``D_v`` holds, per engine tensor, the positions whose stored bit pattern differs between version
``v-1`` and ``v`` and the new bit patterns there (or, format version 2, a dense run of the tensor when that
is smaller). Applying it sets those positions (set semantics), so ``apply(D_v, v-1) == v`` bit for bit and a
second application changes nothing. Version 2 also names the base weights' identity ``h(v-1)``.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import dtypes as dt
from . import kernels, leb128, streams
from . import segment as sg
from .errors import (
    BaseMismatchError,
    DeltaError,
    FormatError,
    IncompatibleTargetError,
    MismatchError,
    SequenceError,
    TrailerError,
    TruncatedError,
)
from .identity import weights_digest
from .names import EngineTensor, ParamMap
from .safetensors_io import WeightSet
from .scratch import Scratch
from .scratch import acquire as acquire_scratch
from .scratch import release as release_scratch

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
    et: EngineTensor, base: Mapping[str, np.ndarray], target: Mapping[str, np.ndarray], scratch: Scratch | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Changed positions of an engine tensor (member block offsets added) and the new raw values. With
    ``scratch`` they may be views of its buffers (valid until the next tensor is extracted with it)."""
    dtype = dt.by_name(et.dtype)
    members: list[tuple[np.ndarray, np.ndarray, int]] | None = []
    for p in et.parts:
        a, b = base[p.hf_name], target[p.hf_name]
        if a.shape != b.shape or not a.dtype.itemsize == b.dtype.itemsize == dtype.itemsize or members is None:
            members = None
            continue
        flat_a, flat_b = (np.ascontiguousarray(x).reshape(-1).view(dtype.raw) for x in (a, b))
        members.append((flat_a, flat_b, p.offset))
    fast = kernels.scan_parts(members, scratch) if members else None
    if fast is not None:  # one compiled pass over every member: compare, positions and values (same as below)
        return fast
    idx_parts, val_parts = [], []
    for p in et.parts:
        a, b = base[p.hf_name], target[p.hf_name]
        pos = changed_positions(a, b)
        if pos.size:
            idx_parts.append(pos + p.offset if p.offset else pos)
            val_parts.append(np.ascontiguousarray(b).reshape(-1).view(dtype.raw)[pos])
    if not idx_parts:
        return np.empty(0, np.int64), np.empty(0, dtype.raw)
    if len(idx_parts) == 1:
        return idx_parts[0], val_parts[0]
    return np.concatenate(idx_parts), np.concatenate(val_parts)


# ---------------------------------------------------------------------------------------------------------
# encoding

# v2: below this changed fraction a sparse encoding is always smaller than a dense one, so the dense
# layout is not considered at all.
DENSE_CANDIDATE_FRACTION = 0.25
_SAMPLE_ENTRIES = 1 << 16  # entries whose coded size predicts the sparse-vs-dense choice


def _dense_looks_smaller(idx: np.ndarray, vals: np.ndarray, flat: np.ndarray) -> bool:
    """Sparse or dense, predicted from the coded sizes of a deterministic sample (the first entries and the
    run of the tensor they span), so that only the chosen encoding of the whole tensor is built."""
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
    segments: int = 0
    index_bytes: int = 0  # as stored
    value_bytes: int = 0  # as stored
    dense_segments: int = 0


def _check_u64(name: str, value: int) -> int:
    if not isinstance(value, int) or not 0 <= value <= sg.U64_MAX:
        raise ValueError(f"{name} must be an integer in [0, 2^64): {value!r}")
    return value


@dataclass
class _Part:
    """One data segment's payload before sealing."""

    layout: int
    entries: int
    start: int
    index_coding: int
    index_stream: bytes | memoryview
    value_coding: int
    value_stream: bytes | memoryview

    @property
    def nbytes(self) -> int:
        return len(self.index_stream) + len(self.value_stream)


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


class DeltaWriter:
    """Turns per-tensor (positions, values) into sealed segments, then the trailer.

    Use it directly when positions are computed elsewhere (for example on the trainer's device);
    :class:`DeltaEncoder` drives it from two weight sets. Every segment is yielded as soon as it is
    sealed; ``h(v)`` accumulates over the yielded bytes.

    ``format_version`` 2 (the default) needs ``base_hash`` = h(v-1), names it in every segment, codes each
    stream with Zstandard when that is smaller, and (through :meth:`add_tensor`'s ``dense``) stores a tensor
    densely when that is smaller. Version 1 writes the original raw sparse format. Output is deterministic.
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
        if format_version == sg.FORMAT_V2:
            if not isinstance(base_hash, bytes | bytearray) or len(base_hash) != sg.HASH_BYTES:
                raise ValueError("format version 2 needs base_hash: the 32-byte h(v-1) of the base weights")
            base_hash = bytes(base_hash)
        else:
            base_hash = None
        self.format_version = format_version
        self.base_hash = base_hash
        self.key = bytes(key)
        self.max_segment_bytes = max_segment_bytes
        self._sha = hashlib.sha256()
        self.segment_count = 0
        self.total_entries = 0
        self.total_bytes = 0
        self.tensors: dict[str, TensorStats] = {}
        self._busy = False
        self.hash: bytes | None = None  # h(v), set by trailer()
        # DeltaEncoder's work buffers: a tensor's intermediates are done with once its segments are sealed.
        self._scratch: Scratch | None = None

    def add_tensor(
        self,
        name: str,
        dtype: str,
        shape: tuple[int, ...],
        indices: np.ndarray,
        values: np.ndarray,
        dense: Callable[[], np.ndarray] | None = None,
        *,
        _extracted: bool = False,
    ) -> Iterator[bytes]:
        """Segments for one tensor: ``indices`` ascending unique flat positions, ``values`` their new bits.

        ``dense`` (version 2): returns the whole new tensor, flat; when given and enough of the tensor
        changed, the dense encoding is built too and the smaller of the two is written. (``_extracted``:
        the positions come from :func:`extract_tensor`, ascending, unique and in range by construction, so
        they are not checked again: a pass over them.)
        """
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
        overhead = sg.data_overhead(self.job, bname, len(shape), self.format_version)
        budget = self.max_segment_bytes - overhead - leb128.MAX_LEB_BYTES
        if budget < d.itemsize + leb128.MAX_LEB_BYTES:  # any single entry must fit, or splitting stalls
            raise ValueError(f"max_segment_bytes {self.max_segment_bytes} too small for tensor {name!r}")
        parts: list[_Part] | None = None
        flat = None
        dense_budget = self.max_segment_bytes - overhead
        if self.format_version == sg.FORMAT_V2 and dense is not None and idx.size >= DENSE_CANDIDATE_FRACTION * numel:
            flat = np.ascontiguousarray(dense()).reshape(-1).view(d.raw)
            if flat.size != numel:
                raise ValueError(f"{name}: dense values hold {flat.size} elements, not {numel}")
            if _dense_looks_smaller(idx, vals, flat):
                parts = self._dense_parts(flat, d, dense_budget)
        if parts is None:
            parts = self._sparse_parts(idx, vals, d, budget)
            # The estimate is a sample: never let the sparse encoding exceed the raw dense tensor.
            size = sum(p.nbytes + overhead for p in parts)
            if flat is not None and size > numel * d.itemsize:
                alt = self._dense_parts(flat, d, dense_budget)
                if sum(p.nbytes + overhead for p in alt) < size:
                    parts = alt
        yield from self._emit(bname, d, shape, numel, parts, stats)

    def _sparse_parts(self, idx: np.ndarray, vals: np.ndarray, d: dt.DType, budget: int) -> list[_Part]:
        # Each segment stores its first position absolute (at most 10 bytes: the reserve taken off
        # `budget`) and then the gaps to the following positions (gap g belongs to entry g+1: segment [s, e)
        # takes gaps s .. e-2, its slice (lo, hi) of the stream). Segments are cut by their raw size; coding
        # can only make them smaller.
        stream, bounds, slices = _gap_stream(idx, d.itemsize, budget, self._scratch)
        v2 = self.format_version == sg.FORMAT_V2
        parts = []
        for p, (lo, hi) in enumerate(slices):
            s, e = bounds[p], bounds[p + 1]
            index_stream = leb128.encode_int(int(idx[s])) + stream[lo:hi].tobytes()
            seg_vals = vals[s:e]
            if v2:
                ic, index_stream = streams.code_index(index_stream)
                vc, value_stream = streams.code_values(seg_vals, self._scratch)
            else:
                ic, vc, value_stream = sg.CODING_RAW, sg.CODING_RAW, seg_vals.data.cast("B")
            parts.append(_Part(sg.LAYOUT_SPARSE, e - s, 0, ic, index_stream, vc, value_stream))
        return parts

    def _dense_parts(self, flat: np.ndarray, d: dt.DType, budget: int) -> list[_Part]:
        per = max(1, budget // d.itemsize)
        parts = []
        for s in range(0, flat.size, per):
            chunk = flat[s : s + per]
            vc, value_stream = streams.code_values(chunk, self._scratch)
            parts.append(_Part(sg.LAYOUT_DENSE, chunk.size, s, sg.CODING_RAW, b"", vc, value_stream))
        return parts

    def _emit(
        self, bname: bytes, d: dt.DType, shape: tuple[int, ...], numel: int, parts: list[_Part], stats: TensorStats
    ) -> Iterator[bytes]:
        self._busy = True
        try:
            for k, p in enumerate(parts):
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
                self._sha.update(seg)
                self.segment_count += 1
                self.total_entries += p.entries
                self.total_bytes += len(seg)
                stats.entries += p.entries
                stats.segments += 1
                stats.dense_segments += p.layout == sg.LAYOUT_DENSE
                stats.index_bytes += len(p.index_stream)
                stats.value_bytes += len(p.value_stream)
                yield seg
        finally:
            self._busy = False

    def add_anchor(self, name: str, dtype: str, shape: tuple[int, ...], value: np.ndarray) -> Iterator[bytes]:
        """Version 2, nothing changed: one entry re-setting element 0 of ``name`` to its current ``value``.

        Set semantics make it a no-op, and it gives the delta a data segment, so ``h(v)`` (over the data
        segments) still covers ``h(v-1)`` and the hash chain continues through an unchanged version.
        """
        if self.segment_count:
            raise RuntimeError("the delta already has data segments")
        self.tensors.pop(name, None)
        return self.add_tensor(name, dtype, shape, np.zeros(1, np.int64), np.asarray(value).reshape(1))

    def trailer(self) -> bytes:
        """The trailer segment; call after every tensor's segments were consumed."""
        if self._busy:
            raise RuntimeError("a tensor's segments were not all consumed")
        if self.hash is not None:
            raise RuntimeError("trailer already produced")
        if self.format_version == sg.FORMAT_V2 and self.segment_count == 0:
            raise RuntimeError("a version-2 delta needs a data segment: add_anchor() when nothing changed")
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


def _flat_target(et: EngineTensor, target: Mapping[str, np.ndarray]) -> Callable[[], np.ndarray]:
    """The engine tensor's new values, flat (members concatenated in block order), built on demand."""

    def build() -> np.ndarray:
        if not et.fused:
            return np.ascontiguousarray(target[et.parts[0].hf_name]).reshape(-1)
        return np.concatenate([np.ascontiguousarray(target[p.hf_name]).reshape(-1) for p in et.parts])

    return build


class DeltaEncoder:
    """Extracts and encodes ``D_v`` between two weight sets, streaming.

    ``segments()`` is a generator: each tensor is compared and its segments yielded before the next
    tensor is looked at, so a sender transmits while extraction goes on. Statistics (``hash``,
    ``segment_count``...) are on ``self.writer`` once the generator is exhausted.

    Version 2 (default): ``base_hash`` is h(v-1); by default ``base.applied_hash``, and for weights that
    record none, their :func:`~rollart.delta.weights_digest` (the identity of weights no delta produced).
    """

    def __init__(
        self,
        base: WeightSet,
        target: WeightSet,
        *,
        job: str,
        version: int,
        key: bytes,
        base_version: int | None = None,
        max_segment_bytes: int = sg.DEFAULT_MAX_SEGMENT_BYTES,
        param_map: ParamMap | None = None,
        format_version: int = sg.FORMAT_VERSION,
        base_hash: bytes | None = None,
    ) -> None:
        self.param_map = param_map or ParamMap.from_weights(base)
        if ParamMap.from_weights(target) != ParamMap.from_weights(base):
            raise IncompatibleTargetError("base and target differ in tensor names, shapes or dtypes")
        self.base, self.target = base, target
        bv = version - 1 if base_version is None else base_version
        if format_version == sg.FORMAT_V2 and base_hash is None:
            base_hash = base.applied_hash or weights_digest(base.arrays, base.dtypes)
        self.writer = DeltaWriter(
            job=job,
            version=version,
            base_version=bv,
            key=key,
            max_segment_bytes=max_segment_bytes,
            format_version=format_version,
            base_hash=base_hash,
        )

    def segments(self) -> Iterator[bytes]:
        w = self.writer
        w._scratch = acquire_scratch()  # one tensor's intermediates at a time: each is sealed before the next
        try:
            for et in self.param_map:
                idx, vals = extract_tensor(et, self.base.arrays, self.target.arrays, w._scratch)
                dense = _flat_target(et, self.target.arrays)
                yield from w.add_tensor(et.name, et.dtype, et.shape, idx, vals, dense, _extracted=True)
        finally:
            release_scratch(w._scratch)
            w._scratch = None
        if w.format_version == sg.FORMAT_V2 and w.segment_count == 0:
            et = next((t for t in self.param_map if t.numel), None)
            if et is None:
                raise ValueError("a version-2 delta needs at least one element in the weights")
            first = np.ascontiguousarray(self.target.arrays[et.parts[0].hf_name]).reshape(-1)[:1]
            yield from w.add_anchor(et.name, et.dtype, et.shape, first)
        yield w.trailer()

    def __iter__(self) -> Iterator[bytes]:
        return self.segments()


def encode_delta(base: WeightSet, target: WeightSet, **kwargs: object) -> Iterator[bytes]:
    """Generator of the segments of ``D_v`` (see :class:`DeltaEncoder` for the arguments)."""
    return DeltaEncoder(base, target, **kwargs).segments()  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# decoding


@dataclass
class TensorDelta:
    """One tensor of a verified delta: its runs of entries (``pieces``), in ascending position order."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    pieces: list[streams.Payload]
    segments: int = 1
    index_bytes: int = 0
    dense_segments: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def entries(self) -> int:
        return sum(int(p.values.size) for p in self.pieces)

    @property
    def indices(self) -> np.ndarray:
        """Every position set (int64, strictly ascending); dense pieces expanded (tests, small tensors)."""
        parts = [
            p.indices if p.indices is not None else np.arange(p.start, p.start + p.values.size) for p in self.pieces
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @property
    def values(self) -> np.ndarray:
        """The new values, in the order of :attr:`indices` (numpy type of the dtype; bf16 as uint16)."""
        return self.pieces[0].values if len(self.pieces) == 1 else np.concatenate([p.values for p in self.pieces])


@dataclass
class Delta:
    """A complete, verified delta ``D_v``."""

    job: str
    version: int
    base_version: int
    hash: bytes  # h(v)
    tensors: dict[str, TensorDelta]
    segment_count: int  # data segments (the trailer not counted)
    total_entries: int
    total_bytes: int  # all segments, trailer included
    format_version: int = sg.FORMAT_V1
    base_hash: bytes | None = None  # v2: h(v-1), checked against the target before anything is written

    def hf_names(self, param_map: ParamMap) -> list[str]:
        """Every HF tensor to reload for this delta: whole fused groups, never a lone member."""
        out: list[str] = []
        for name in self.tensors:
            out.extend(param_map.to_hf(name))
        return out


@dataclass
class _Decoded:
    seg: sg.Segment
    payload: streams.Payload


@dataclass
class DeltaStager:
    """Accepts the segments of one delta in any order; verifies each on arrival; assembles on finish().

    Pin ``job``, ``version``, ``base_version`` and ``base_hash`` when known (a subscriber knows what it
    expects); otherwise the first segment fixes them and later ones must agree (MismatchError), except the
    base (BaseMismatchError). A pinned ``base_hash`` rejects a version-2 segment naming another one before
    it is staged. A repeated segment with identical bytes is ignored; with other bytes it is a
    SequenceError. ``key=None`` skips the HMACs (``inspect`` without a key); every other check runs.
    """

    key: bytes | None
    job: str | None = None
    version: int | None = None
    base_version: int | None = None
    base_hash: bytes | None = None
    format_version: int | None = None
    _segs: dict[int, _Decoded] = field(default_factory=dict, init=False, repr=False)
    _trailer: sg.Segment | None = field(default=None, init=False, repr=False)
    _sha: hashlib._Hash = field(default_factory=hashlib.sha256, init=False, repr=False)
    _hashed: int = field(default=0, init=False)  # segments 0.._hashed-1 are in _sha (the contiguous prefix)

    def __post_init__(self) -> None:
        if self.key is not None and not self.key:
            raise ValueError("job key must be non-empty bytes")

    def add(self, raw: bytes | bytearray | memoryview, expect_seq: int | None = None) -> sg.Segment:
        """Verify one segment and stage it. Raises a DeltaError subclass and stages nothing on failure.

        ``expect_seq``: reject (SequenceError) a segment with another sequence number (ordered input).
        """
        seg = sg.parse(raw, self.key)
        if expect_seq is not None and seg.seq != expect_seq:
            raise SequenceError(f"segment {seg.seq} where {expect_seq} was expected")
        self._check_identity(seg)
        if seg.is_trailer:
            if self._trailer is not None:
                if bytes(self._trailer.raw) != bytes(seg.raw):
                    raise SequenceError("a second, different trailer")
                return seg
            if self._segs and max(self._segs) >= seg.segment_count:
                raise SequenceError(f"trailer counts {seg.segment_count} segments but {max(self._segs)} arrived")
            self._trailer = seg
            return seg
        if self._trailer is not None and seg.seq >= self._trailer.segment_count:
            raise SequenceError(f"segment {seg.seq} beyond the trailer's count {self._trailer.segment_count}")
        old = self._segs.get(seg.seq)
        if old is not None:
            if bytes(old.seg.raw) != bytes(seg.raw):
                raise SequenceError(f"two different segments with sequence number {seg.seq}")
            return seg
        payload = streams.decode_payload(seg)
        self._segs[seg.seq] = _Decoded(seg, payload)
        while self._hashed in self._segs:
            self._sha.update(self._segs[self._hashed].seg.raw)
            self._hashed += 1
        return seg

    def _check_identity(self, seg: sg.Segment) -> None:
        # All checks before any state changes, so a rejected segment pins nothing.
        if self.job is not None and seg.job != self.job:
            raise MismatchError(f"segment {seg.seq} belongs to job {seg.job!r}, not {self.job!r}")
        if self.version is not None and seg.version != self.version:
            raise MismatchError(f"segment {seg.seq} belongs to version {seg.version}, not {self.version}")
        if self.format_version is not None and seg.format_version != self.format_version:
            raise MismatchError(f"segment {seg.seq} has format version {seg.format_version}, not {self.format_version}")
        if self.base_version is not None and seg.base_version != self.base_version:
            raise BaseMismatchError(
                f"segment {seg.seq} is based on version {seg.base_version}, expected {self.base_version}"
            )
        if seg.base_hash is not None and self.base_hash is not None and seg.base_hash != self.base_hash:
            raise BaseMismatchError(
                f"segment {seg.seq} is based on weights {seg.base_hash.hex()[:16]}…, "
                f"expected {self.base_hash.hex()[:16]}…"
            )
        self.job, self.version, self.base_version = seg.job, seg.version, seg.base_version
        self.format_version = seg.format_version
        if seg.base_hash is not None:
            self.base_hash = seg.base_hash

    @property
    def received(self) -> list[int]:
        """Sequence numbers staged so far (the trailer's included)."""
        got = sorted(self._segs)
        return got + [self._trailer.seq] if self._trailer is not None else got

    @property
    def expected_count(self) -> int | None:
        """Total segments including the trailer, once the trailer is known."""
        return None if self._trailer is None else self._trailer.segment_count + 1

    def missing(self) -> list[int]:
        """Sequence numbers known to be missing.

        With the trailer staged: every absent number below its count, complete. Without it: the gaps
        below the highest number seen plus that number + 1 (the trailer or more data may follow), so the
        list is never empty while the delta is incomplete.
        """
        if self._trailer is not None:
            return [i for i in range(self._trailer.segment_count) if i not in self._segs]
        top = max(self._segs) + 1 if self._segs else 0
        return [i for i in range(top) if i not in self._segs] + [top]

    @property
    def complete(self) -> bool:
        return self._trailer is not None and len(self._segs) == self._trailer.segment_count

    def finish(self) -> Delta:
        """Check completeness, the trailer and the tensor structure; return the assembled Delta."""
        if self._trailer is None:
            raise TruncatedError("no trailer: the delta is incomplete", self.missing())
        missing = self.missing()
        if missing:
            raise TruncatedError(f"{len(missing)} segments missing, first {missing[:8]}", missing)
        tr = self._trailer
        assert self._hashed == tr.segment_count
        digest = self._sha.copy().digest()
        if digest != tr.hash:
            raise TrailerError(f"h(v) mismatch: segments hash to {digest.hex()}, trailer says {tr.hash.hex()}")
        total = sum(d.seg.entries for d in self._segs.values())
        if total != tr.total_entries:
            raise TrailerError(f"trailer counts {tr.total_entries} entries, segments hold {total}")
        tensors = self._assemble()
        if len(tensors) != tr.tensor_count:
            raise TrailerError(f"trailer counts {tr.tensor_count} tensors, segments hold {len(tensors)}")
        if tr.format_version == sg.FORMAT_V2 and tr.segment_count == 0:
            raise FormatError("a version-2 delta has at least one data segment")
        assert self.job is not None and self.version is not None and self.base_version is not None
        return Delta(
            job=self.job,
            version=self.version,
            base_version=self.base_version,
            hash=digest,
            tensors=tensors,
            segment_count=tr.segment_count,
            total_entries=total,
            total_bytes=sum(len(d.seg.raw) for d in self._segs.values()) + len(tr.raw),
            format_version=tr.format_version,
            base_hash=tr.base_hash,
        )

    def _assemble(self) -> dict[str, TensorDelta]:
        tensors: dict[str, TensorDelta] = {}
        run: list[_Decoded] = []

        def close() -> None:
            first = run[0].seg
            if len(run) != first.parts:
                raise FormatError(f"tensor {first.name}: {len(run)} of {first.parts} parts in a row")
            if first.name in tensors:
                raise FormatError(f"tensor {first.name} appears in two runs of segments")
            for a, b in itertools.pairwise(run):
                if b.payload.first <= a.payload.last:
                    raise FormatError(f"tensor {first.name}: part {b.seg.part} overlaps part {a.seg.part}")
            assert first.dtype is not None
            tensors[first.name] = TensorDelta(
                name=first.name,
                dtype=first.dtype.name,
                shape=first.shape,
                pieces=[d.payload for d in run],
                segments=len(run),
                index_bytes=sum(d.seg.index_bytes for d in run),
                dense_segments=sum(d.seg.is_dense for d in run),
            )
            run.clear()

        for seq in range(len(self._segs)):
            d = self._segs[seq]
            s = d.seg
            if run:
                f = run[0].seg
                same = (s.name, s.dtype, s.shape, s.parts) == (f.name, f.dtype, f.shape, f.parts)
                if same and s.part == len(run):
                    run.append(d)
                    continue
                if s.name == f.name:
                    raise FormatError(f"tensor {s.name}: part {s.part} or its header out of place")
                close()
            if s.part != 0:
                raise FormatError(f"tensor {s.name}: first segment is part {s.part}")
            run.append(d)
        if run:
            close()
        return tensors


def decode_delta(
    data: bytes | memoryview | Iterable[bytes | memoryview],
    key: bytes | None,
    *,
    job: str | None = None,
    version: int | None = None,
    base_version: int | None = None,
    base_hash: bytes | None = None,
) -> Delta:
    """Verify and decode a whole delta: one buffer (a .dseg file's bytes) or an iterable of segments.

    Segments must come in sequence order (a reordered file is a SequenceError), the trailer last and
    nothing after it. ``key=None`` skips the HMACs (and only them).
    """
    stager = DeltaStager(key, job, version, base_version, base_hash)
    parts = sg.split(data) if isinstance(data, bytes | bytearray | memoryview) else data
    for expect, raw in enumerate(parts):
        if stager._trailer is not None:
            raise FormatError("bytes after the trailer")
        stager.add(raw, expect_seq=expect)
    return stager.finish()


# ---------------------------------------------------------------------------------------------------------
# application


def param_map_for(delta: Delta, target: WeightSet) -> ParamMap:
    """The naming the delta was encoded in: engine names (fused, the default) or, for a delta encoded with
    ``fuse=False`` (``rollart delta encode --no-fuse``), the plain Hugging Face names."""
    fused = ParamMap.from_weights(target)
    if all(name in fused for name in delta.tensors):
        return fused
    plain = ParamMap.from_weights(target, fuse=False)
    return plain if all(name in plain for name in delta.tensors) else fused


def check_base(delta: Delta, target: WeightSet) -> bool:
    """The base checks ``apply_delta`` runs before anything else; False when the target already holds D_v.

    BaseMismatchError when the target's version is unknown or not the delta's base, or (version 2) when the
    target's identity is not the delta's ``h(v-1)``: ``target.applied_hash`` when recorded, otherwise the
    target's :func:`~rollart.delta.weights_digest` (which only the weights no delta produced can match).
    """
    if target.version == delta.version:
        if target.applied_hash is not None and target.applied_hash != delta.hash:
            raise BaseMismatchError(f"target is at version {delta.version} from a different delta")
        return False  # already applied: set semantics make re-applying a no-op, so skip the work
    if target.version is None:
        raise BaseMismatchError("target version unknown; set WeightSet.version to the delta's base")
    if target.version != delta.base_version:
        raise BaseMismatchError(
            f"delta {delta.version} is based on version {delta.base_version}, target is at {target.version}"
        )
    if delta.base_hash is not None:
        have = target.applied_hash
        if have is None:
            have = weights_digest(target.arrays, target.dtypes)
        if have != delta.base_hash:
            raise BaseMismatchError(
                f"delta {delta.version} is based on weights {delta.base_hash.hex()[:16]}…, the target's version "
                f"{target.version} is {have.hex()[:16]}… (another job, or other weights)"
            )
    return True


def _plan(delta: Delta, target: WeightSet, pm: ParamMap) -> list[tuple[np.ndarray, np.ndarray | slice, np.ndarray]]:
    """Check the whole delta against the target and list (flat raw target, positions or slice, values) writes."""
    plan: list[tuple[np.ndarray, np.ndarray | slice, np.ndarray]] = []
    for td in delta.tensors.values():
        et = pm.engine(td.name)
        if et.dtype != td.dtype:
            raise IncompatibleTargetError(f"{td.name}: delta dtype {td.dtype}, target {et.dtype}")
        if et.shape != td.shape:
            raise IncompatibleTargetError(f"{td.name}: delta shape {td.shape}, target {et.shape}")
        d = dt.by_name(td.dtype)
        flats = {}
        for part in et.parts:
            arr = target.arrays[part.hf_name]
            if not arr.flags.c_contiguous or not arr.flags.writeable:
                raise IncompatibleTargetError(f"{part.hf_name}: target array is not writable and contiguous")
            flats[part.hf_name] = arr.reshape(-1).view(d.raw)
        for piece in td.pieces:
            vals = piece.values.view(d.raw)
            if piece.indices is None:  # dense: one slice per member block it overlaps
                lo, hi = piece.start, piece.start + vals.size
                for part in et.parts:
                    a, b = max(lo, part.offset), min(hi, part.offset + part.numel)
                    if a < b:
                        plan.append(
                            (flats[part.hf_name], slice(a - part.offset, b - part.offset), vals[a - lo : b - lo])
                        )
                continue
            for part, sl in pm.split_positions(td.name, piece.indices):
                pos = piece.indices[sl]
                plan.append((flats[part.hf_name], pos - part.offset if part.offset else pos, vals[sl]))
    return plan


def apply_delta(delta: Delta, target: WeightSet, param_map: ParamMap | None = None) -> bool:
    """Apply a verified delta in place. Returns True if applied, False if the target already holds it.

    Runs :func:`check_base` (version, and for version 2 the base identity h(v-1)), then checks every
    tensor's presence, dtype, shape and writability, all before the first write, so a rejected delta
    leaves the target untouched. Without ``param_map`` the naming comes from :func:`param_map_for`.
    """
    if not check_base(delta, target):
        return False
    pm = param_map or param_map_for(delta, target)
    plan = _plan(delta, target, pm)
    for flat, pos, vals in plan:
        flat[pos] = vals
    target.version = delta.version
    target.applied_hash = delta.hash
    return True


def apply_entries(delta: Delta, arrays: Mapping[str, np.ndarray], param_map: ParamMap | None = None) -> None:
    """Set the delta's entries into ``arrays`` without any version bookkeeping (pure set semantics)."""
    ws = WeightSet(dict(arrays), {n: dt.infer(a) for n, a in arrays.items()})
    if param_map is None:
        param_map = ParamMap.from_specs({n: (tuple(a.shape), _dtype_of(n, a, delta)) for n, a in arrays.items()})
    for flat, pos, vals in _plan(delta, ws, param_map):
        flat[pos] = vals


def _dtype_of(name: str, a: np.ndarray, delta: Delta) -> str:
    td = delta.tensors.get(name)
    return td.dtype if td is not None and dt.by_name(td.dtype).itemsize == a.dtype.itemsize else dt.infer(a)


# ---------------------------------------------------------------------------------------------------------
# inspection

# What decoding checks (docs/delta-format.md, "Decoding and verification"): inspect and apply run the same code.
DELTA_CHECKS = (
    "framing and segment lengths",
    "CRC-32 of every segment",
    "header fields, dtype, shape/numel, part/parts, layout, codings, stream lengths",
    "one job, version, format version, base version and base hash in every segment",
    "index streams: Zstandard frames, canonical LEB128, entry count, gaps >= 1, positions < numel",
    "value streams: Zstandard frames and sizes, BOOL values 0/1",
    "sequence numbers in order, nothing after the trailer, no segment missing",
    "h(v), total entries and tensor count against the trailer",
    "structure: each tensor's parts complete, in order, not overlapping, in one run",
)
TARGET_CHECKS = (
    "base version and base hash h(v-1) against the target",
    "every tensor present in the target with the same dtype and shape, writable",
)


def inspect_delta(
    data: bytes | memoryview, key: bytes | None = None, base: WeightSet | None = None
) -> dict[str, Any]:
    """Verify a .dseg buffer with every check ``apply`` runs, and summarise it.

    The delta is decoded by the same code as :func:`decode_delta`; HMACs are verified only when ``key`` is
    given (``authenticated``), and the target checks only when ``base`` is given. What was not checked is
    listed under ``not_checked``. Raises a DeltaError subclass on any failure (the same class apply raises).
    """
    delta = decode_delta(data, key)
    not_checked = [] if key is not None else ["HMAC-SHA256 of every segment (no job key)"]
    if base is None:
        not_checked += list(TARGET_CHECKS)
    else:
        if check_base(delta, base):
            _plan(delta, base, param_map_for(delta, base))
    tensors = []
    index_bytes = value_bytes = dense = 0
    segs: dict[str, dict[str, int]] = {}
    for raw in sg.split(data):
        s = sg.parse(raw, None)  # already verified above; read the per-segment sizes
        if s.is_trailer:
            continue
        t = segs.setdefault(s.name, {"index_bytes": 0, "value_bytes": 0, "dense_segments": 0})
        t["index_bytes"] += s.index_bytes
        t["value_bytes"] += s.value_bytes
        t["dense_segments"] += s.is_dense
        index_bytes += s.index_bytes
        value_bytes += s.value_bytes
        dense += s.is_dense
    for name, td in delta.tensors.items():
        tensors.append(
            {
                "name": name,
                "dtype": td.dtype,
                "shape": list(td.shape),
                "entries": td.entries,
                "segments": td.segments,
                **segs[name],
            }
        )
    return {
        "job": delta.job,
        "version": delta.version,
        "base_version": delta.base_version,
        "format_version": delta.format_version,
        "base_hash": delta.base_hash.hex() if delta.base_hash is not None else None,
        "segments": delta.segment_count + 1,
        "data_segments": delta.segment_count,
        "dense_segments": dense,
        "entries": delta.total_entries,
        "index_bytes": index_bytes,
        "value_bytes": value_bytes,
        "total_bytes": delta.total_bytes,
        "hash": delta.hash.hex(),
        "authenticated": key is not None,
        "checked": list(DELTA_CHECKS)
        + (["HMAC-SHA256 of every segment"] if key is not None else [])
        + (list(TARGET_CHECKS) if base is not None else []),
        "not_checked": not_checked,
        "tensors": tensors,
    }


__all__ = [
    "DELTA_CHECKS",
    "TARGET_CHECKS",
    "Delta",
    "DeltaEncoder",
    "DeltaError",
    "DeltaStager",
    "DeltaWriter",
    "TensorDelta",
    "TensorStats",
    "apply_delta",
    "apply_entries",
    "changed_positions",
    "check_base",
    "decode_delta",
    "encode_delta",
    "extract_tensor",
    "inspect_delta",
    "param_map_for",
]
