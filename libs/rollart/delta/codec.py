"""Extraction, streaming encoding, staged decoding and exact application of sparse deltas.

``D_v`` holds, per engine tensor, the positions whose stored bit pattern differs between version
``v-1`` and ``v`` and the new bit patterns there. Applying it sets those positions (set semantics), so
``apply(D_v, v-1) == v`` bit for bit and a second application changes nothing.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from . import dtypes as dt
from . import leb128
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
from .names import EngineTensor, ParamMap
from .safetensors_io import WeightSet

_EXTRACT_CHUNK = 1 << 26  # elements compared per step: bounds the temporary bool array to 64 MiB


# ---------------------------------------------------------------------------------------------------------
# extraction


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
    out = []
    for s in range(0, a.size, _EXTRACT_CHUNK):
        e = min(s + _EXTRACT_CHUNK, a.size)
        out.append(np.flatnonzero(a[s:e] != b[s:e]) + s)
    return np.concatenate(out)


def extract_tensor(
    et: EngineTensor, base: Mapping[str, np.ndarray], target: Mapping[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Changed positions of an engine tensor (member block offsets added) and the new raw values."""
    dtype = dt.by_name(et.dtype)
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


@dataclass
class TensorStats:
    name: str
    dtype: str
    numel: int
    entries: int = 0
    segments: int = 0
    index_bytes: int = 0
    value_bytes: int = 0


def _check_u64(name: str, value: int) -> int:
    if not isinstance(value, int) or not 0 <= value <= sg.U64_MAX:
        raise ValueError(f"{name} must be an integer in [0, 2^64): {value!r}")
    return value


class DeltaWriter:
    """Turns per-tensor (positions, values) into sealed segments, then the trailer.

    Use it directly when positions are computed elsewhere (for example on the trainer's device);
    :class:`DeltaEncoder` drives it from two weight sets. Every segment is yielded as soon as it is
    sealed; ``h(v)`` accumulates over the yielded bytes.
    """

    def __init__(
        self,
        *,
        job: str,
        version: int,
        base_version: int,
        key: bytes,
        max_segment_bytes: int = sg.DEFAULT_MAX_SEGMENT_BYTES,
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
        self.key = bytes(key)
        self.max_segment_bytes = max_segment_bytes
        self._sha = hashlib.sha256()
        self.segment_count = 0
        self.total_entries = 0
        self.total_bytes = 0
        self.tensors: dict[str, TensorStats] = {}
        self._busy = False
        self.hash: bytes | None = None  # h(v), set by trailer()

    def add_tensor(
        self, name: str, dtype: str, shape: tuple[int, ...], indices: np.ndarray, values: np.ndarray
    ) -> Iterator[bytes]:
        """Segments for one tensor: ``indices`` ascending unique flat positions, ``values`` their new bits."""
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
        if idx.size and (int(idx[0]) < 0 or int(idx[-1]) >= numel or not bool((idx[1:] > idx[:-1]).all())):
            raise ValueError(f"{name}: positions must be ascending, unique and within {numel}")
        stats = TensorStats(name, d.name, numel)
        self.tensors[name] = stats
        if idx.size == 0:
            return
        if d.name == "BOOL" and bool((vals > 1).any()):
            raise ValueError(f"{name}: BOOL values must be 0 or 1")
        budget = self.max_segment_bytes - sg.data_overhead(self.job, bname, len(shape)) - leb128.MAX_LEB_BYTES
        if budget < d.itemsize + leb128.MAX_LEB_BYTES:  # any single entry must fit, or splitting stalls
            raise ValueError(f"max_segment_bytes {self.max_segment_bytes} too small for tensor {name!r}")
        # Each segment stores its first position absolute (at most 10 bytes: the reserve taken off
        # `budget`) and then the gaps to the following positions. gaps[j-1] belongs to entry j;
        # ends[j] is where entry j's gap ends in the gap stream, so segment [s, e) takes ends[s]:ends[e-1].
        n = idx.size
        gaps = np.diff(idx).astype(np.uint64)
        if n == 1 or int(gaps.max()) < 0x80:  # dense: every gap is one byte
            stream_arr = gaps.astype(np.uint8)
            per = budget // (1 + d.itemsize)
            bounds = [*range(0, n, per), n]
            ends = None
        else:
            lengths = leb128.encoded_lengths(gaps)
            stream_arr = np.frombuffer(leb128.encode(gaps, lengths), np.uint8)
            ends = np.zeros(n, dtype=np.int64)
            np.cumsum(lengths, out=ends[1:])
            cost = ends + np.arange(1, n + 1, dtype=np.int64) * d.itemsize  # cumulative bytes through entry j
            bounds = [0]
            while bounds[-1] < n:  # one iteration per segment, not per entry
                start = bounds[-1]
                used = int(cost[start - 1]) if start else 0
                bounds.append(int(np.searchsorted(cost, used + budget, side="right")))
        parts = len(bounds) - 1
        self._busy = True
        try:
            for p in range(parts):
                s, e = bounds[p], bounds[p + 1]
                first = leb128.encode(idx[s : s + 1].astype(np.uint64))
                lo, hi = (s, e - 1) if ends is None else (int(ends[s]), int(ends[e - 1]))
                seg_stream = first + stream_arr[lo:hi].tobytes()
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
                    part=p,
                    parts=parts,
                    entries=e - s,
                    index_stream=seg_stream,
                    values=memoryview(vals[s:e]).cast("B"),
                )
                self._sha.update(seg)
                self.segment_count += 1
                self.total_entries += e - s
                self.total_bytes += len(seg)
                stats.entries += e - s
                stats.segments += 1
                stats.index_bytes += len(seg_stream)
                stats.value_bytes += (e - s) * d.itemsize
                yield seg
        finally:
            self._busy = False

    def trailer(self) -> bytes:
        """The trailer segment; call after every tensor's segments were consumed."""
        if self._busy:
            raise RuntimeError("a tensor's segments were not all consumed")
        if self.hash is not None:
            raise RuntimeError("trailer already produced")
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
        )
        self.total_bytes += len(seg)
        return seg


class DeltaEncoder:
    """Extracts and encodes ``D_v`` between two weight sets, streaming.

    ``segments()`` is a generator: each tensor is compared and its segments yielded before the next
    tensor is looked at, so a sender transmits while extraction goes on. Statistics (``hash``,
    ``segment_count``...) are on ``self.writer`` once the generator is exhausted.
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
    ) -> None:
        self.param_map = param_map or ParamMap.from_weights(base)
        if ParamMap.from_weights(target) != ParamMap.from_weights(base):
            raise IncompatibleTargetError("base and target differ in tensor names, shapes or dtypes")
        self.base, self.target = base, target
        bv = version - 1 if base_version is None else base_version
        self.writer = DeltaWriter(
            job=job, version=version, base_version=bv, key=key, max_segment_bytes=max_segment_bytes
        )

    def segments(self) -> Iterator[bytes]:
        for et in self.param_map:
            idx, vals = extract_tensor(et, self.base.arrays, self.target.arrays)
            yield from self.writer.add_tensor(et.name, et.dtype, et.shape, idx, vals)
        yield self.writer.trailer()

    def __iter__(self) -> Iterator[bytes]:
        return self.segments()


def encode_delta(base: WeightSet, target: WeightSet, **kwargs: object) -> Iterator[bytes]:
    """Generator of the segments of ``D_v`` (see :class:`DeltaEncoder` for the arguments)."""
    return DeltaEncoder(base, target, **kwargs).segments()  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# decoding


@dataclass
class TensorDelta:
    name: str
    dtype: str
    shape: tuple[int, ...]
    indices: np.ndarray  # int64, strictly ascending
    values: np.ndarray  # numpy type of the dtype (bf16 as uint16)
    segments: int = 1
    index_bytes: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def entries(self) -> int:
        return int(self.indices.size)


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

    def hf_names(self, param_map: ParamMap) -> list[str]:
        """Every HF tensor to reload for this delta: whole fused groups, never a lone member."""
        out: list[str] = []
        for name in self.tensors:
            out.extend(param_map.to_hf(name))
        return out


@dataclass
class _Decoded:
    seg: sg.Segment
    indices: np.ndarray
    values: np.ndarray


@dataclass
class DeltaStager:
    """Accepts the segments of one delta in any order; verifies each on arrival; assembles on finish().

    Pin ``job``, ``version`` and ``base_version`` when known (a subscriber knows what it expects);
    otherwise the first segment fixes them and later ones must agree (MismatchError), except the base
    (BaseMismatchError). A repeated segment with identical bytes is ignored; with other bytes it is a
    SequenceError.
    """

    key: bytes
    job: str | None = None
    version: int | None = None
    base_version: int | None = None
    _segs: dict[int, _Decoded] = field(default_factory=dict, init=False, repr=False)
    _trailer: sg.Segment | None = field(default=None, init=False, repr=False)
    _sha: hashlib._Hash = field(default_factory=hashlib.sha256, init=False, repr=False)
    _hashed: int = field(default=0, init=False)  # segments 0.._hashed-1 are in _sha (the contiguous prefix)

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("job key must be non-empty bytes")

    def add(self, raw: bytes | memoryview, expect_seq: int | None = None) -> sg.Segment:
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
        indices = leb128.decode_indices(seg.index_view, seg.entries, seg.numel)
        assert seg.dtype is not None
        values = np.frombuffer(seg.value_view, dtype=seg.dtype.numpy)
        if seg.dtype.name == "BOOL" and bool((values.view(np.uint8) > 1).any()):
            raise FormatError(f"segment {seg.seq}: BOOL value other than 0 or 1")
        self._segs[seg.seq] = _Decoded(seg, indices, values)
        while self._hashed in self._segs:
            self._sha.update(self._segs[self._hashed].seg.raw)
            self._hashed += 1
        return seg

    def _check_identity(self, seg: sg.Segment) -> None:
        if self.job is None:
            self.job = seg.job
        elif seg.job != self.job:
            raise MismatchError(f"segment {seg.seq} belongs to job {seg.job!r}, not {self.job!r}")
        if self.version is None:
            self.version = seg.version
        elif seg.version != self.version:
            raise MismatchError(f"segment {seg.seq} belongs to version {seg.version}, not {self.version}")
        if self.base_version is None:
            self.base_version = seg.base_version
        elif seg.base_version != self.base_version:
            raise BaseMismatchError(
                f"segment {seg.seq} is based on version {seg.base_version}, expected {self.base_version}"
            )

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
                if int(b.indices[0]) <= int(a.indices[-1]):
                    raise FormatError(f"tensor {first.name}: part {b.seg.part} overlaps part {a.seg.part}")
            assert first.dtype is not None
            tensors[first.name] = TensorDelta(
                name=first.name,
                dtype=first.dtype.name,
                shape=first.shape,
                indices=run[0].indices if len(run) == 1 else np.concatenate([d.indices for d in run]),
                values=run[0].values if len(run) == 1 else np.concatenate([d.values for d in run]),
                segments=len(run),
                index_bytes=sum(d.seg.index_bytes for d in run),
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
    key: bytes,
    *,
    job: str | None = None,
    version: int | None = None,
    base_version: int | None = None,
) -> Delta:
    """Verify and decode a whole delta: one buffer (a .dseg file's bytes) or an iterable of segments.

    Segments must come in sequence order (a reordered file is a SequenceError), the trailer last and
    nothing after it.
    """
    stager = DeltaStager(key, job, version, base_version)
    parts = sg.split(data) if isinstance(data, bytes | bytearray | memoryview) else data
    for expect, raw in enumerate(parts):
        if stager._trailer is not None:
            raise FormatError("bytes after the trailer")
        stager.add(raw, expect_seq=expect)
    return stager.finish()


# ---------------------------------------------------------------------------------------------------------
# application


def _plan(delta: Delta, target: WeightSet, pm: ParamMap) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Check the whole delta against the target and list (flat raw target, positions, raw values) writes."""
    plan = []
    for td in delta.tensors.values():
        et = pm.engine(td.name)
        if et.dtype != td.dtype:
            raise IncompatibleTargetError(f"{td.name}: delta dtype {td.dtype}, target {et.dtype}")
        if et.shape != td.shape:
            raise IncompatibleTargetError(f"{td.name}: delta shape {td.shape}, target {et.shape}")
        d = dt.by_name(td.dtype)
        vals = td.values.view(d.raw)
        for part, sl in pm.split_positions(td.name, td.indices):
            arr = target.arrays[part.hf_name]
            if not arr.flags.c_contiguous or not arr.flags.writeable:
                raise IncompatibleTargetError(f"{part.hf_name}: target array is not writable and contiguous")
            flat = arr.reshape(-1).view(d.raw)
            pos = td.indices[sl]
            plan.append((flat, pos - part.offset if part.offset else pos, vals[sl]))
    return plan


def apply_delta(delta: Delta, target: WeightSet, param_map: ParamMap | None = None) -> bool:
    """Apply a verified delta in place. Returns True if applied, False if the target already holds it.

    Rejects (BaseMismatchError) a target whose version is unknown or is not the delta's base; checks
    every tensor's presence, dtype, shape and writability before the first write, so a rejected delta
    leaves the target untouched.
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
    pm = param_map or ParamMap.from_weights(target)
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


def inspect_delta(data: bytes | memoryview, key: bytes | None = None) -> dict[str, object]:
    """Summary of a .dseg buffer without decoding index streams.

    Verifies framing, CRCs, sequence order and the trailer hash always, and HMACs when ``key`` is given
    (``authenticated`` in the result). Raises a DeltaError subclass on any failure.
    """
    sha = hashlib.sha256()
    tensors: dict[str, dict[str, object]] = {}
    entries = index_bytes = value_bytes = total = 0
    trailer: sg.Segment | None = None
    first: sg.Segment | None = None
    for seq, raw in enumerate(sg.split(data)):
        if trailer is not None:
            raise FormatError("bytes after the trailer")
        s = sg.parse(raw, key)
        first = first or s
        if s.seq != seq:
            raise SequenceError(f"segment {s.seq} where {seq} was expected")
        if (s.job, s.version, s.base_version) != (first.job, first.version, first.base_version):
            raise MismatchError(f"segment {s.seq} belongs to another delta")
        total += len(raw)
        if s.is_trailer:
            trailer = s
            continue
        sha.update(raw)
        t = tensors.setdefault(
            s.name,
            {
                "name": s.name,
                "dtype": s.dtype.name if s.dtype else "",
                "shape": list(s.shape),
                "entries": 0,
                "segments": 0,
                "index_bytes": 0,
                "value_bytes": 0,
            },
        )
        t["entries"] = int(t["entries"]) + s.entries  # type: ignore[call-overload]
        t["segments"] = int(t["segments"]) + 1  # type: ignore[call-overload]
        t["index_bytes"] = int(t["index_bytes"]) + s.index_bytes  # type: ignore[call-overload]
        t["value_bytes"] = int(t["value_bytes"]) + s.value_bytes  # type: ignore[call-overload]
        entries += s.entries
        index_bytes += s.index_bytes
        value_bytes += s.value_bytes
    if trailer is None or first is None:
        raise TruncatedError("no trailer: the delta is incomplete")
    if sha.digest() != trailer.hash:
        raise TrailerError("h(v) in the trailer does not match the segments")
    if trailer.total_entries != entries:
        raise TrailerError(f"trailer counts {trailer.total_entries} entries, segments hold {entries}")
    return {
        "job": first.job,
        "version": first.version,
        "base_version": first.base_version,
        "segments": trailer.segment_count + 1,
        "data_segments": trailer.segment_count,
        "entries": entries,
        "index_bytes": index_bytes,
        "value_bytes": value_bytes,
        "total_bytes": total,
        "hash": trailer.hash.hex(),
        "authenticated": key is not None,
        "tensors": list(tensors.values()),
    }


__all__ = [
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
    "decode_delta",
    "encode_delta",
    "extract_tensor",
    "inspect_delta",
]
