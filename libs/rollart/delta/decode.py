"""Staged decoding of ``D_v``: segments verified on arrival, in any order, assembled into a :class:`Delta`.

Invariant: nothing is staged from a segment that fails a check, and :meth:`DeltaStager.finish` returns a
delta only when every check of docs/delta-format.md ("Decoding and verification") passed: completeness,
h(v) and the counts against the trailer, and each tensor's parts complete, in order and in one run. The
first failing check raises; its order is the spec's error precedence.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from . import records as rc
from . import segment as sg
from . import streams
from .errors import BaseMismatchError, FormatError, MismatchError, SequenceError, TrailerError, TruncatedError
from .names import ParamMap


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
    def xor(self) -> bool:
        """Whether any piece's values are XOR with the base (v3) rather than the new bits."""
        return any(p.xor for p in self.pieces)

    @property
    def values(self) -> np.ndarray:
        """The stored values, in the order of :attr:`indices` (numpy type of the dtype; bf16 as uint16): the
        new bits, or for :attr:`xor` pieces the new bits XOR the base's."""
        return self.pieces[0].values if len(self.pieces) == 1 else np.concatenate([p.values for p in self.pieces])


@dataclass
class Delta:
    """A complete, verified delta ``D_v``. Pieces with ``xor`` (v3) hold values relative to the base
    ``h(v-1)``: :func:`~rollart.delta.apply_delta` resolves them after its base checks."""

    job: str
    version: int
    base_version: int
    hash: bytes  # h(v)
    tensors: dict[str, TensorDelta]
    segment_count: int  # data segments (the trailer not counted)
    total_entries: int
    total_bytes: int  # all segments, trailer included
    format_version: int = sg.FORMAT_V1
    base_hash: bytes | None = None  # v2, v3: h(v-1), checked against the target before anything is written

    def hf_names(self, param_map: ParamMap) -> list[str]:
        """Every HF tensor to reload for this delta: whole fused groups, never a lone member."""
        out: list[str] = []
        for name in self.tensors:
            out.extend(param_map.to_hf(name))
        return out


@dataclass
class _Decoded:
    seg: sg.Segment
    items: list[tuple[rc.Record, streams.Payload]]  # the segment's tensor records, decoded


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
        items = [(r, streams.decode_record(r)) for r in seg.tensor_records]
        self._segs[seg.seq] = _Decoded(seg, items)
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
        if tr.format_version != sg.FORMAT_V1 and tr.segment_count == 0:
            raise FormatError(f"a version-{tr.format_version} delta has at least one data segment")
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
        """Each tensor's records, in (seq, record) order: parts complete, in order, ascending, in one run."""
        tensors: dict[str, TensorDelta] = {}
        run: list[tuple[rc.Record, streams.Payload]] = []

        def close() -> None:
            first = run[0][0]
            if len(run) != first.parts:
                raise FormatError(f"tensor {first.name}: {len(run)} of {first.parts} parts in a row")
            if first.name in tensors:
                raise FormatError(f"tensor {first.name} appears in two runs of segments")
            for (ra, a), (rb, b) in itertools.pairwise(run):
                if b.first <= a.last:
                    raise FormatError(f"tensor {first.name}: part {rb.part} overlaps part {ra.part}")
            tensors[first.name] = TensorDelta(
                name=first.name,
                dtype=first.dtype.name,
                shape=first.shape,
                pieces=[p for _, p in run],
                segments=len(run),
                index_bytes=sum(r.index_bytes for r, _ in run),
                dense_segments=sum(r.is_dense for r, _ in run),
            )
            run.clear()

        for seq in range(len(self._segs)):
            for r, payload in self._segs[seq].items:
                if run:
                    f = run[0][0]
                    same = (r.name, r.dtype, r.shape, r.parts) == (f.name, f.dtype, f.shape, f.parts)
                    if same and r.part == len(run):
                        run.append((r, payload))
                        continue
                    if r.name == f.name:
                        raise FormatError(f"tensor {r.name}: part {r.part} or its header out of place")
                    close()
                if r.part != 0:
                    raise FormatError(f"tensor {r.name}: first segment is part {r.part}")
                run.append((r, payload))
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
