"""Which segments of one delta a receiver holds, whether it is complete, and ``h(v)`` over them in sequence
order; the sinks a receiving session puts verified segments into. Duplicates are dropped by sequence number; a
segment of another job, version or base is refused (docs/delta-format.md)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Awaitable, Callable
from typing import Protocol

import numpy as np

from rollart.delta import segment as sg
from rollart.delta.errors import BaseMismatchError, MismatchError, SequenceError, TrailerError

_SEQ = struct.Struct("<I")  # a segment's seq sits at byte 12, its version at 16 (docs/delta-format.md)


def seq_of(raw: bytes | bytearray | memoryview) -> int:
    return _SEQ.unpack_from(raw, 12)[0]


class SegmentTracker:
    """Which segments of one delta are here, whether it is complete, and ``h(v)`` over them in seq order.

    Segments arrive in any order (stripes overtake each other); the hash covers the contiguous prefix as
    it fills, keeping only the out-of-order segments referenced meanwhile. No element is ever looked at.
    """

    def __init__(self, job: str, version: int, base_version: int | None = None) -> None:
        self.job = job
        self.version = version
        self.base_version = base_version
        self._have: set[int] = set()
        self._pending: dict[int, bytes | bytearray | memoryview] = {}
        self._sha = hashlib.sha256()
        self._hashed = 0
        self.segment_count: int | None = None  # data segments, from the trailer
        self.trailer_hash: bytes | None = None
        self.hash: bytes | None = None  # verified h(v)
        self.bytes = 0
        self.duplicates = 0

    def check(self, seg: sg.Segment) -> None:
        if seg.job != self.job:
            raise MismatchError(f"segment {seg.seq} belongs to job {seg.job!r}, not {self.job!r}")
        if seg.version != self.version:
            raise MismatchError(f"segment {seg.seq} belongs to version {seg.version}, not {self.version}")
        if self.base_version is not None and seg.base_version != self.base_version:
            raise BaseMismatchError(
                f"segment {seg.seq} of version {seg.version} is based on {seg.base_version}, not {self.base_version}"
            )
        if seg.is_trailer:
            if self.segment_count is not None:
                raise SequenceError(f"a second trailer (seq {seg.seq}) for version {self.version}")
            if self._have and max(self._have) >= seg.segment_count:
                raise SequenceError(f"trailer counts {seg.segment_count} segments, more arrived")
        elif self.segment_count is not None and seg.seq >= self.segment_count:
            raise SequenceError(f"segment {seg.seq} beyond the trailer's count {self.segment_count}")

    def add(self, seg: sg.Segment) -> bool:
        """Record a verified segment; False for a duplicate. Raises a DeltaError for a foreign one."""
        if seg.seq in self._have:
            self.duplicates += 1
            return False
        self.check(seg)
        if self.base_version is None:
            self.base_version = seg.base_version
        self._have.add(seg.seq)
        self.bytes += len(seg.raw)
        if seg.is_trailer:
            self.segment_count = seg.segment_count
            self.trailer_hash = seg.hash
        else:
            self._pending[seg.seq] = seg.raw
            while self._hashed in self._pending:
                self._sha.update(self._pending.pop(self._hashed))
                self._hashed += 1
        if self.complete and self.hash is None:
            digest = self._sha.digest()
            if digest != self.trailer_hash:
                raise TrailerError(
                    f"version {self.version}: segments hash to {digest.hex()[:16]}…, "
                    f"the trailer says {self.trailer_hash.hex()[:16]}…"  # type: ignore[union-attr]
                )
            self.hash = digest
        return True

    def has(self, seq: int) -> bool:
        return seq in self._have

    @property
    def received(self) -> int:
        return len(self._have)

    @property
    def total(self) -> int | None:
        """Segments including the trailer, once the trailer is known."""
        return None if self.segment_count is None else self.segment_count + 1

    @property
    def complete(self) -> bool:
        return self.segment_count is not None and len(self._have) == self.segment_count + 1

    @property
    def verified(self) -> bool:
        return self.hash is not None

    def resume(self) -> tuple[int, list[int]]:
        """(from_seq, missing): every seq below from_seq is here except ``missing``."""
        if self.segment_count is not None:
            top = self.segment_count + 1
        else:
            top = max(self._have) + 1 if self._have else 0
        if len(self._have) == top:
            return top, []
        have = np.fromiter(self._have, dtype=np.int64, count=len(self._have))
        mask = np.ones(top, dtype=bool)
        mask[have[have < top]] = False
        return top, np.flatnonzero(mask).tolist()

    def missing(self) -> list[int]:
        """Seqs known to be missing (with no trailer yet, also the next one after the highest seen)."""
        top, miss = self.resume()
        return miss if self.segment_count is not None else [*miss, top]


class SegmentSink(Protocol):
    """Where a receiving session puts verified segments (a relay's buffer, a subscriber's stager)."""

    tracker: SegmentTracker

    async def put(self, seg: sg.Segment) -> bool:
        """Stage a verified segment; False when it was a duplicate."""
        ...


class TrackerSink:
    """A sink that only tracks (and optionally hands each new segment to ``on_segment``)."""

    def __init__(
        self, tracker: SegmentTracker, on_segment: Callable[[sg.Segment], Awaitable[None]] | None = None
    ) -> None:
        self.tracker = tracker
        self.on_segment = on_segment
        self.segments: dict[int, bytes | bytearray | memoryview] = {}
        self.keep = on_segment is None

    async def put(self, seg: sg.Segment) -> bool:
        if not self.tracker.add(seg):
            return False
        if self.keep:
            self.segments[seg.seq] = seg.raw
        if self.on_segment is not None:
            await self.on_segment(seg)
        return True

    def ordered(self) -> list[bytes | bytearray | memoryview]:
        return [self.segments[i] for i in sorted(self.segments)]
