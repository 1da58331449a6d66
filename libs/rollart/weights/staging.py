"""Staged weight versions: the one state machine between "segments of ``v`` are arriving" and "``v`` is applied".

A process that receives weights has exactly one :class:`VersionStaging`. Every way a version arrives goes
through its transitions: deltas pulled from a relay and fetched from its cache (the subscriber's
:class:`~rollart.weights.subscriber.DeltaSource`), deltas pushed segment by segment (the actor's
``StageDelta``), full weights (the actor's ``PullBuckets``). The code that applies weights (the actor's
``WeightManager``, the library's ``WeightSubscriber``) owns the *active* version and passes it in; it asks
for a :meth:`VersionStaging.route` to the version it must make active, applies it, then calls
:meth:`VersionStaging.prune`. Nothing else writes the entries.

States of a version ``v`` (``a`` is the active version)::

    absent --open / first segment--> ARRIVING --last segment; whole delta verified and fits--> STAGED
                                       |    \\--bad whole delta (trailer, h(v), structure, fit)--> REJECTED
                                       \\--bad pushed segment--------------------------------> REJECTED
    REJECTED --a segment of v again--> ARRIVING (from scratch)
    absent --add_full (buckets, checkpoint)--> STAGED (base -1)
    any state, v <= a --prune(a) after the owner applied a--> absent

- ARRIVING: a ``DeltaStager`` verifies each segment on arrival (CRC-32, HMAC, job, version, sequence) and a
  ``SegmentTracker`` counts them, pins the base version of the first one and hashes ``h(v)`` in order.
- STAGED: the decoded delta (trailer, ``h(v)``, tensor structure checked; ``fits`` passed: the served
  model has its tensors with their dtypes and shapes), or full weights.
- REJECTED: its data is dropped; the reason is kept (also after the entry is gone, in ``rejected``) and is
  what a commit that needed it reports.

Refused transitions (:class:`StagingError`, nothing changes):

- a *pushed* segment of ``v`` whose base is neither ``a`` nor a version staged or arriving here:
  ``FAILED_PRECONDITION`` at its first segment (``v`` is recorded as rejected). A segment *pulled* from a
  source is accepted whatever its base: the source announced it and its base may still come; the route
  checks the link.
- a malformed segment, or one whose message fields disagree with its header: ``INVALID_ARGUMENT``.
- :meth:`route` when a link of ``a -> v`` is not STAGED: ``FAILED_PRECONDITION`` saying which and why
  (still arriving, based on another version, rejected, never seen); ``at`` is where the chain stops.

Not errors: a segment of a version ``<= a`` or already staged is a duplicate (re-pushes are harmless).

Invariants: an entry is in exactly one of ARRIVING, STAGED, REJECTED; after ``prune(a)`` every entry is
above ``a``; a STAGED delta's ``hash`` is the ``h(v)`` its segments hash to; a route is made only of
STAGED entries, each based on the version the previous one produces.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rollart.delta import Delta, DeltaStager, WeightSet
from rollart.delta import segment as sg
from rollart.delta.errors import BaseMismatchError, DeltaError, IncompatibleTargetError
from rollart.runtime import errors
from rollart.v1 import common_pb2

from . import transport as tp

log = logging.getLogger(__name__)

ARRIVING, STAGED, REJECTED = "arriving", "staged", "rejected"

ARTIFACT = {
    "delta": common_pb2.WEIGHT_ARTIFACT_DELTA,
    "buckets": common_pb2.WEIGHT_ARTIFACT_BUCKETS,
    "checkpoint": common_pb2.WEIGHT_ARTIFACT_CHECKPOINT,
}

# How many rejection reasons are remembered (a commit that needs a rejected version reports why).
REJECTED_KEPT = 64


class StagingError(errors.Coded):
    """A staging transition was refused; ``code`` is the gRPC status name (``runtime.errors`` maps it). Nothing
    was changed.

    ``at``: for a route, the version the chain stops at. ``out_of_range``: the source's cache no longer
    holds the deltas after ``at`` (the owner may load a checkpoint instead).
    """

    code: str  # a status name, as every caller passes

    def __init__(self, code: str, message: str, *, at: int | None = None, out_of_range: bool = False) -> None:
        super().__init__(code, message)
        self.at = at
        self.out_of_range = out_of_range


def delta_error_code(exc: DeltaError) -> str:
    """A delta that does not fit the active weights (base, tensors) is FAILED_PRECONDITION; a bad segment
    (checksum, HMAC, header, trailer) is INVALID_ARGUMENT."""
    if isinstance(exc, BaseMismatchError | IncompatibleTargetError):
        return "FAILED_PRECONDITION"
    return "INVALID_ARGUMENT"


@dataclass
class StagedVersion:
    """One version in staging: a delta (ARRIVING, STAGED or REJECTED) or full weights (STAGED)."""

    version: int
    source: str
    artifact: str = "delta"  # "delta" | "buckets" | "checkpoint"
    tracker: tp.SegmentTracker | None = None
    stager: DeltaStager | None = None
    started_at: float = field(default_factory=time.time)
    completed_at: float | None = None
    delta: Delta | None = None
    full: WeightSet | None = None
    full_hash: bytes = b""
    full_parts: int = 0
    full_bytes: int = 0
    error: str = ""
    error_code: str = ""

    @property
    def state(self) -> str:
        if self.error:
            return REJECTED
        if self.delta is not None or self.full is not None:
            return STAGED
        return ARRIVING

    @property
    def base_version(self) -> int | None:
        """-1 for full weights; None while no segment has said."""
        if self.artifact != "delta":
            return -1
        return self.tracker.base_version if self.tracker is not None else None

    @property
    def hash(self) -> bytes:
        """h(v): verified once staged, the trailer's claim while arriving."""
        if self.delta is not None:
            return self.delta.hash
        if self.artifact != "delta":
            return self.full_hash
        return (self.tracker.trailer_hash if self.tracker is not None else None) or b""

    @property
    def received(self) -> int:
        return self.tracker.received if self.tracker is not None else 0

    def proto(self) -> common_pb2.StagedWeights:
        staged = self.state == STAGED
        if self.artifact == "delta":
            tr = self.tracker
            rejected = self.state == REJECTED
            parts = 0 if rejected or tr is None else tr.received
            total = (tr.total or 0) if tr is not None else 0
            nbytes = 0 if rejected or tr is None else tr.bytes
        else:
            parts = total = self.full_parts
            nbytes = self.full_bytes
        msg = common_pb2.StagedWeights(
            version=self.version,
            base_version=self.base_version if self.base_version is not None else -1,
            artifact=ARTIFACT[self.artifact],
            hash=self.hash,
            parts_received=parts,
            parts_total=total,
            bytes_received=nbytes,
            complete=staged,
            verified=staged,
            source=self.source,
            error=self.error,
        )
        msg.started_at.FromNanoseconds(int(self.started_at * 1e9))
        if self.completed_at is not None:
            msg.completed_at.FromNanoseconds(int(self.completed_at * 1e9))
        return msg


@dataclass
class Route:
    """How to get from ``from_version`` to ``to_version``: optional full weights, then deltas in order."""

    from_version: int
    to_version: int
    full: StagedVersion | None
    deltas: list[Delta]

    @property
    def hash(self) -> bytes:
        """h(to_version) as staged (empty when unknown, e.g. full weights without a recorded hash)."""
        if self.deltas:
            return self.deltas[-1].hash
        return self.full.full_hash if self.full is not None else b""


class StagingSink:
    """A transport ``SegmentSink`` into one ARRIVING entry (a pull session fills it)."""

    def __init__(self, staging: VersionStaging, entry: StagedVersion) -> None:
        assert entry.tracker is not None
        self.staging = staging
        self.entry = entry
        self.tracker = entry.tracker

    async def put(self, seg: sg.Segment) -> bool:
        return self.staging.add(self.entry, seg)


class VersionStaging:
    """The versions staged after the active one. See the module docstring for the state machine."""

    def __init__(
        self,
        *,
        key: bytes | None,
        job: str,
        max_versions: int | None = None,
        fits: Callable[[Delta], None] | None = None,
    ) -> None:
        self.key = bytes(key) if key else None
        self.job = job
        self.max_versions = max_versions  # None: unbounded
        self.fits = fits  # raises IncompatibleTargetError for a delta the served model cannot take
        self.entries: dict[int, StagedVersion] = {}
        self.rejected: collections.OrderedDict[int, str] = collections.OrderedDict()
        self.segments_received = 0
        self.bytes_received = 0
        self.duplicates = 0
        self._changed = asyncio.Event()

    # ----------------------------------------------------------------------------------------- arriving

    def open(self, version: int, active: int | None, source: str) -> StagedVersion | None:
        """The entry the segments of ``version`` go to: created ARRIVING (a REJECTED one starts afresh).

        None when ``version`` is not above the active one or full weights are staged for it.
        """
        if active is not None and version <= active:
            return None
        e = self.entries.get(version)
        if e is not None and e.state == REJECTED:
            del self.entries[version]
            e = None
        if e is not None:
            return e if e.artifact == "delta" else None
        if self.key is None:
            raise StagingError("FAILED_PRECONDITION", "no job key: deltas cannot be verified")
        self._make_room()
        e = StagedVersion(
            version,
            source,
            tracker=tp.SegmentTracker(self.job, version),
            # No key: every segment reaching add() was verified (CRC-32 and HMAC) by whoever parsed it
            # (the transport's receiver or stage_message); the stager re-checks only the CRC.
            stager=DeltaStager(None, job=self.job, version=version),
        )
        self.entries[version] = e
        return e

    def sink(self, version: int, active: int | None, source: str) -> StagingSink | None:
        """A sink for a pull session of ``version``; None when it is not wanted (active, or staged already)."""
        e = self.open(version, active, source)
        if e is None or e.state != ARRIVING:
            return None
        e.source = source
        return StagingSink(self, e)

    def add(self, e: StagedVersion, seg: sg.Segment) -> bool:
        """Stage one segment into ``e``, parsed and verified under the job key by the caller.

        False for a duplicate (or an entry no longer ARRIVING).

        Raises a DeltaError for a segment that does not belong (the entry is unchanged) and TrailerError
        when the complete set does not hash to the trailer's h(v). A whole delta that fails its checks
        makes the entry REJECTED (no exception: see ``e.error``).
        """
        if e.state != ARRIVING:
            return False
        assert e.tracker is not None and e.stager is not None
        if e.tracker.has(seg.seq):
            e.tracker.duplicates += 1
            self.duplicates += 1
            return False
        e.tracker.check(seg)
        e.stager.add(seg.raw)  # CRC again (not the HMAC: already checked), decodes the index stream
        e.tracker.add(seg)
        self.segments_received += 1
        self.bytes_received += len(seg.raw)
        if e.tracker.complete:
            self._finish(e)
        return True

    def stage_message(self, msg: common_pb2.DeltaSegment, active: int | None, *, source: str, pushed: bool) -> bool:
        """Stage one DeltaSegment message: pushed (StageDelta) or fetched (FetchDeltas). True if new.

        Raises StagingError: INVALID_ARGUMENT for a bad segment, FAILED_PRECONDITION for a delta that
        cannot apply (a pushed delta on an unknown base; tensors the model lacks). A pushed version that
        fails is REJECTED (its staged data discarded).
        """
        if self.key is None:
            raise StagingError("FAILED_PRECONDITION", "no job key: deltas cannot be verified")
        if not msg.data:
            raise StagingError("INVALID_ARGUMENT", "segment data is empty")
        try:
            seg = sg.parse(msg.data, self.key)
        except DeltaError as exc:
            raise StagingError("INVALID_ARGUMENT", f"segment {msg.sequence} of v{msg.version}: {exc}") from None
        fields = (msg.job_id, msg.version, msg.base_version, msg.sequence, msg.trailer)
        header = (seg.job, seg.version, seg.base_version, seg.seq, seg.is_trailer)
        if fields != header:
            raise StagingError(
                "INVALID_ARGUMENT",
                f"message fields (job, version, base, sequence, trailer) {fields} disagree with the header {header}",
            )
        if seg.job != self.job:
            raise StagingError("INVALID_ARGUMENT", f"segment belongs to job {seg.job!r}; this staging is {self.job!r}")
        v = seg.version
        if active is not None and v <= active:
            return False  # already active (or older)
        known = self.entries.get(v)
        if pushed and (known is None or known.state == REJECTED):
            base = seg.base_version
            prior = self.entries.get(base)
            if base != active and (prior is None or prior.state == REJECTED):
                why = f"delta v{v} is based on v{base}, but the active version is v{active} and v{base} is not staged"
                self._reject(v, why)
                raise StagingError("FAILED_PRECONDITION", why)
        e = self.open(v, active, source)
        if e is None:
            return False
        try:
            new = self.add(e, seg)
        except DeltaError as exc:
            why = f"v{v} segment {seg.seq}: {type(exc).__name__}: {exc}"
            if pushed:
                self._discard(e, why, delta_error_code(exc))
            raise StagingError(delta_error_code(exc), why) from None
        if pushed and e.state == REJECTED:
            raise StagingError(e.error_code, e.error)
        return new

    def add_full(
        self, version: int, ws: WeightSet, hash_: bytes, *, artifact: str, source: str, parts: int, nbytes: int
    ) -> StagedVersion:
        """Full weights of ``version`` (STAGED at once: the caller verified them)."""
        if version not in self.entries:
            self._make_room()
        e = StagedVersion(
            version,
            source,
            artifact=artifact,
            full=ws,
            full_hash=hash_,
            full_parts=parts,
            full_bytes=nbytes,
            completed_at=time.time(),
        )
        self.entries[version] = e
        self._changed.set()
        return e

    def _finish(self, e: StagedVersion) -> None:
        assert e.stager is not None
        try:
            delta = e.stager.finish()
            if self.fits is not None:
                self.fits(delta)
        except DeltaError as exc:
            self._discard(e, f"v{e.version}: {type(exc).__name__}: {exc}", delta_error_code(exc))
            return
        e.delta, e.stager = delta, None  # the decoded delta is kept; the staging copies go
        e.completed_at = time.time()
        self._changed.set()
        log.info(
            "staged v%d (base v%s): %d segments, %d entries", e.version, e.base_version, e.received, delta.total_entries
        )

    def _discard(self, e: StagedVersion, why: str, code: str) -> None:
        e.error, e.error_code = why, code
        e.stager = None
        e.delta = None
        e.completed_at = time.time()
        self._reject(e.version, why)
        self._changed.set()
        log.warning("staging of v%d rejected: %s", e.version, why)

    def _reject(self, version: int, why: str) -> None:
        self.rejected[version] = why
        self.rejected.move_to_end(version)
        while len(self.rejected) > REJECTED_KEPT:
            self.rejected.popitem(last=False)

    def _make_room(self) -> None:
        if self.max_versions is None:
            return
        while len(self.entries) >= self.max_versions:
            victims = sorted(v for v, e in self.entries.items() if e.state != STAGED) or sorted(self.entries)
            log.warning("staging full: dropping v%d", victims[0])
            del self.entries[victims[0]]

    # ----------------------------------------------------------------------------------------- applied

    def prune(self, active: int) -> None:
        """The owner made ``active`` active: every entry at or below it leaves."""
        for v in [v for v in self.entries if v <= active]:
            del self.entries[v]
        self._changed.set()

    # ------------------------------------------------------------------------------------------- routes

    def newest_full(self, active: int, target: int) -> StagedVersion | None:
        """The newest staged full weights in (active, target]."""
        fulls = [e for e in self.entries.values() if e.full is not None and active < e.version <= target]
        return max(fulls, key=lambda e: e.version) if fulls else None

    def next_delta(self, cur: int, target: int) -> StagedVersion | None:
        """The lowest STAGED delta based on ``cur`` and not beyond ``target``."""
        nxt = [
            e
            for e in self.entries.values()
            if e.delta is not None and e.delta.base_version == cur and e.version <= target
        ]
        return min(nxt, key=lambda e: e.version) if nxt else None

    def route(self, active: int, target: int) -> Route:
        """The staged route from ``active`` to ``target`` (full weights first when staged, then deltas).

        Raises StagingError(FAILED_PRECONDITION, at=the version the chain stops at) when a link is missing.
        """
        full = self.newest_full(active, target)
        cur = full.version if full is not None else active
        deltas: list[Delta] = []
        while cur < target:
            e = self.next_delta(cur, target)
            if e is None:
                raise StagingError("FAILED_PRECONDITION", self.why_missing(cur, target), at=cur)
            assert e.delta is not None
            deltas.append(e.delta)
            cur = e.version
        return Route(active, target, full, deltas)

    def arriving(self, cur: int, target: int, pulling: Callable[[int], bool] = lambda v: False) -> list[StagedVersion]:
        """ARRIVING entries that may still link ``cur`` towards ``target`` (segments in, or a pull under way)."""
        return sorted(
            (
                e
                for e in self.entries.values()
                if e.version <= target
                and e.state == ARRIVING
                and e.base_version in (cur, None)
                and (e.received > 0 or pulling(e.version))
            ),
            key=lambda e: e.version,
        )

    def reason(self, cur: int, target: int) -> str:
        """Why no staged delta links ``cur`` towards ``target``; empty when nothing here says."""
        for e in sorted(self.entries.values(), key=lambda e: e.version):
            if e.version <= target and e.state == ARRIVING and e.base_version == cur and e.received:
                total = e.tracker.total if e.tracker is not None else None
                return (
                    f"delta v{e.version} (based on v{cur}) is still arriving: {e.received} of "
                    f"{total if total else '?'} segments"
                )
        for e in sorted(self.entries.values(), key=lambda e: e.version):
            base = e.base_version
            if cur < e.version <= target and e.state == STAGED and base is not None and base >= 0 and base != cur:
                return (
                    f"the delta staged for version {e.version} is based on version {base}, "
                    f"but the active version is {cur}: it is not applied"
                )
        for v in range(cur + 1, target + 1):
            if v in self.rejected:
                return f"v{v} was rejected: {self.rejected[v]}"
        return ""

    def why_missing(self, cur: int, target: int) -> str:
        return self.reason(cur, target) or f"no staged delta is based on v{cur} (needed to reach v{target})"

    async def wait_changed(self, timeout: float) -> None:
        """Until an entry changes state (or ``timeout``)."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    # ------------------------------------------------------------------------------------------- status

    def staged_deltas(self) -> list[int]:
        """Versions whose delta is STAGED (what a subscriber tells its source it has)."""
        return sorted(v for v, e in self.entries.items() if e.delta is not None)

    def staged(self, version: int = 0) -> list[common_pb2.StagedWeights]:
        return [self.entries[v].proto() for v in sorted(self.entries) if version in (0, v)]

    def missing(self, version: int = 0) -> dict[int, list[int]]:
        """Sequence numbers still missing per ARRIVING delta whose trailer is in."""
        out = {}
        for v, e in sorted(self.entries.items()):
            tr = e.tracker
            if version in (0, v) and e.state == ARRIVING and tr is not None and tr.segment_count is not None:
                out[v] = tr.missing()
        return out
