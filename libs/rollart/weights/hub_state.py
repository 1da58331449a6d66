"""What a segment hub holds: one :class:`VersionBuffer` per version and one :class:`Subscriber` record per peer.

A buffer stages the verified segments of ``D_v`` as they arrive (deduplicated by sequence number, ``h(v)`` checked
at the end) and lets any number of readers follow it *as it fills* (cut-through); once the version is complete and
persisted its segments may be read back from the hub's cache file. :class:`~rollart.weights.hub.DeltaHub` owns
both; see docs/weight-plane.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import Counter, Gauge

from rollart.delta import segment as sg
from rollart.runtime import errors, timeutil
from rollart.v1 import relay_pb2

from . import transport as tp

if TYPE_CHECKING:
    from .hub import DeltaHub

HUB_BYTES = Counter("rollart_weights_hub_bytes_total", "Delta bytes through a hub", ["hub", "direction"])
HUB_REJECTED = Counter("rollart_weights_hub_rejected_total", "Segments or stripes a hub rejected", ["hub", "reason"])
HUB_CACHE_BYTES = Gauge("rollart_weights_hub_cache_bytes", "Bytes of cached deltas", ["hub"])
HUB_VERSIONS = Gauge("rollart_weights_hub_versions", "Versions held by a hub", ["hub"])


class HubError(errors.Coded):
    """A request the hub cannot serve; ``code`` is the gRPC status name (``runtime.errors`` maps it)."""

    code: str  # a status name, as every caller passes


def _ts(seconds: float | None) -> Timestamp | None:
    return None if seconds is None else timeutil.timestamp(seconds)


# --------------------------------------------------------------------------------------------------- buffers


class VersionBuffer:
    """The segments of one delta at this hub, filled by any number of sources, followed by readers."""

    def __init__(self, hub: DeltaHub, version: int, source: str) -> None:
        self.hub = hub
        self.tracker = tp.SegmentTracker(hub.job, version)
        self.segs: dict[int, bytes | bytearray] = {}
        self.order: list[int] = []  # arrival order: what followers replay
        self.source = source
        self.first_at: float | None = None
        self.completed_at: float | None = None
        self.path: Path | None = None
        self.index: dict[int, tuple[int, int]] = {}  # seq -> (offset, length) in `path`
        self.readers = 0
        self._changed = asyncio.Event()

    @property
    def version(self) -> int:
        return self.tracker.version

    @property
    def base_version(self) -> int | None:
        return self.tracker.base_version

    @property
    def complete(self) -> bool:
        return self.tracker.complete

    @property
    def verified(self) -> bool:
        return self.tracker.verified

    @property
    def nbytes(self) -> int:
        return self.tracker.bytes

    async def put(self, seg: sg.Segment) -> bool:
        """Stage a verified segment (the SegmentSink protocol); False for a duplicate."""
        if not self.tracker.add(seg):
            return False
        # bytes or the transport's frame buffer (a bytearray nobody writes again): kept as is, never copied
        raw = seg.raw if isinstance(seg.raw, bytes | bytearray) else bytes(seg.raw)
        self.segs[seg.seq] = raw
        self.order.append(seg.seq)
        HUB_BYTES.labels(self.hub.relay_id, "in").inc(len(raw))
        self.hub.bytes_received += len(raw)
        self.hub.last_segment_at = time.time()
        if self.first_at is None:
            self.first_at = time.time()
            self.hub._on_first(self)
        self._wake()
        if self.tracker.complete:
            self.completed_at = time.time()
            self.hub._on_complete(self)
        return True

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def get(self, seq: int) -> bytes | bytearray:
        raw = self.segs.get(seq)
        if raw is not None:
            return raw
        if self.path is None or seq not in self.index:
            raise HubError("DATA_LOSS", f"segment {seq} of version {self.version} is no longer held")
        off, n = self.index[seq]
        with open(self.path, "rb") as f:
            f.seek(off)
            data = f.read(n)
        if len(data) != n:
            raise HubError("DATA_LOSS", f"cache file of version {self.version} is truncated")
        return data

    def seqs_in_order(self) -> list[int]:
        return sorted(self.order)

    async def follow(self, *, ordered: bool = False, wait_complete: bool = False) -> AsyncIterator[bytes | bytearray]:
        """Every segment, then each new one as it arrives, until the version is complete.

        ``ordered``: a complete version in sequence order (a partial one is followed in arrival order).
        ``wait_complete``: store-and-forward; nothing is yielded before the whole delta is here.
        """
        self.readers += 1
        try:
            if wait_complete:
                while not self.complete:
                    await self._changed.wait()
            if self.complete and ordered:
                for seq in self.seqs_in_order():
                    yield self.get(seq)
                return
            i = 0
            while True:
                while i < len(self.order):
                    seq = self.order[i]
                    i += 1
                    yield self.get(seq)
                if self.complete:
                    return
                await self._changed.wait()
        finally:
            self.readers -= 1

    def cached(self) -> relay_pb2.CachedDelta:
        tr = self.tracker
        msg = relay_pb2.CachedDelta(
            version=self.version,
            base_version=self.base_version if self.base_version is not None else -1,
            hash=tr.hash or b"",
            segments=tr.received,
            segments_total=tr.total or 0,
            bytes=tr.bytes,
            complete=tr.complete,
            verified=tr.verified,
            source=self.source,
        )
        if self.first_at is not None:
            msg.first_segment_at.CopyFrom(timeutil.timestamp(self.first_at))
        if self.completed_at is not None:
            msg.completed_at.CopyFrom(timeutil.timestamp(self.completed_at))
        return msg


# ------------------------------------------------------------------------------------------------ subscribers


@dataclass
class Subscriber:
    subscriber_id: str
    kind: relay_pb2.RelaySubscriberKind
    region: str = ""
    mode: relay_pb2.DeliveryMode = relay_pb2.DELIVERY_MODE_PULL
    endpoint: str = ""
    streams: int = 4
    control_endpoint: str = ""
    has_active: bool = False
    active_version: int = -1
    staged: set[int] = field(default_factory=set)
    subscribed_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    watchers: int = 0
    bytes_sent: int = 0
    sent_version: int = -1
    committed_version: int = -1
    connected: bool = False

    def proto(self) -> relay_pb2.RelaySubscriber:
        return relay_pb2.RelaySubscriber(
            subscriber_id=self.subscriber_id,
            kind=self.kind,
            region=self.region,
            mode=self.mode,
            endpoint=self.endpoint,
            connected=self.connected,
            watching=self.watchers > 0,
            active_version=self.active_version if self.has_active else -1,
            sent_version=self.sent_version,
            bytes_sent=self.bytes_sent,
            committed_version=self.committed_version,
            subscribed_at=_ts(self.subscribed_at),
            last_seen=_ts(self.last_seen),
        )
