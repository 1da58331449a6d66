"""The ``rollart.v1.Relay`` gRPC service over a :class:`~rollart.weights.hub.DeltaHub`.

Used by the relay service (``rollart-relay``) and by the trainer's publisher, which serves the same API
so that actors can fall back to the trainer when every relay is gone. Bad input ends a call with
INVALID_ARGUMENT (or the code the hub names), never with a partial change. Methods raise
``rollart.runtime.errors``; the server's handler wrapper turns them into statuses.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from grpc import aio

from rollart.delta import segment as sg
from rollart.delta.errors import DeltaError
from rollart.runtime import errors, ids
from rollart.v1 import common_pb2, relay_pb2, relay_pb2_grpc

from .hub import DeltaHub

log = logging.getLogger(__name__)

UpstreamSetter = Callable[[relay_pb2.RelayUpstream], Awaitable[relay_pb2.RelayUpstreamStatus]]


def segment_message(raw: bytes | bytearray) -> common_pb2.DeltaSegment:
    """The gRPC form of a segment, its fields read from the header (unverified: the receiver verifies)."""
    _, _, kind, _, _, seq, version, base, job_len = sg._COMMON.unpack_from(raw, 0)
    job = bytes(raw[sg._COMMON.size : sg._COMMON.size + job_len]).decode("utf-8", "replace")
    return common_pb2.DeltaSegment(
        job_id=job,
        version=version,
        base_version=base,
        sequence=seq,
        trailer=kind == sg.KIND_TRAILER,
        data=bytes(raw),  # a copy only on the gRPC (catch-up) path; protobuf wants bytes
    )


class RelayServicer(relay_pb2_grpc.RelayServicer):
    """gRPC face of a hub. ``set_upstream`` handles SetUpstream (a trainer has none)."""

    def __init__(self, hub: DeltaHub, set_upstream: UpstreamSetter | None = None) -> None:
        self.hub = hub
        self.set_upstream = set_upstream

    async def Subscribe(self, request, context):  # noqa: N802 - gRPC method names
        ids.check_id("subscriber_id", request.subscriber_id)
        return self.hub.subscribe(request)

    async def Unsubscribe(self, request, context):  # noqa: N802
        ids.check_id("subscriber_id", request.subscriber_id)
        self.hub.unsubscribe(request.subscriber_id)
        return common_pb2.Nothing()

    async def WatchEvents(self, request, context) -> AsyncIterator[relay_pb2.RelayEvent]:  # noqa: N802
        ids.check_id("subscriber_id", request.subscriber_id)
        if request.from_sequence < 0:
            raise errors.InvalidArgument("from_sequence", "must be >= 0")
        async for event in self.hub.watch(request.subscriber_id, request.from_sequence, request.only_new):
            yield event

    async def SetUpstream(self, request, context):  # noqa: N802
        if self.set_upstream is None:
            raise errors.FailedPrecondition("this endpoint is the trainer: it has no upstream")
        up = request.upstream
        if up.kind not in (relay_pb2.UPSTREAM_KIND_TRAINER, relay_pb2.UPSTREAM_KIND_RELAY):
            raise errors.InvalidArgument("upstream.kind", "must be TRAINER or RELAY")
        if up.kind == relay_pb2.UPSTREAM_KIND_RELAY and not up.endpoint:
            raise errors.InvalidArgument("upstream.endpoint", "is required for a RELAY upstream")
        for ep in [up.endpoint, *up.fallbacks]:
            if ep and (":" not in ep or not ep.rpartition(":")[2].isdigit()):
                raise errors.InvalidArgument("upstream", f"endpoint {errors.shorten(ep)} is not HOST:PORT")
        if up.streams < 0 or up.streams > 64:
            raise errors.InvalidArgument("upstream.streams", "must be 0..64")
        return await self.set_upstream(up)

    async def PushSegments(self, request_iterator, context):  # noqa: N802
        accepted = duplicates = 0
        touched: set[int] = set()
        async for msg in request_iterator:
            try:
                seg = sg.parse(msg.data, self.hub.key)
            except DeltaError as exc:
                raise errors.InvalidArgument(
                    "", f"segment {msg.sequence} of version {msg.version} rejected ({type(exc).__name__}): {exc}"
                ) from None
            fields = (msg.job_id, msg.version, msg.base_version, msg.sequence, msg.trailer)
            header = (seg.job, seg.version, seg.base_version, seg.seq, seg.is_trailer)
            if fields != header:
                shown = ["(" + ", ".join(errors.shorten(v) for v in t) + ")" for t in (fields, header)]
                raise errors.InvalidArgument("", "message fields {} disagree with the segment header {}".format(*shown))
            if seg.job != self.hub.job:
                raise errors.InvalidArgument(
                    "job_id", f"job_id {errors.shorten(seg.job)} of the segment is not this relay's {self.hub.job!r}"
                )
            try:
                new = await self.hub.buffer(seg.version, "grpc-push").put(seg)
            except DeltaError as exc:
                raise errors.InvalidArgument("", f"segment {seg.seq} of version {seg.version}: {exc}") from None
            touched.add(seg.version)
            accepted += new
            duplicates += not new
        return relay_pb2.PushSegmentsResponse(
            versions=[self.hub.versions[v].cached() for v in sorted(touched) if v in self.hub.versions],
            accepted=accepted,
            duplicates=duplicates,
        )

    async def FetchDeltas(self, request, context) -> AsyncIterator[common_pb2.DeltaSegment]:  # noqa: N802
        if any(s < 0 or s > 0xFFFFFFFF for s in request.only_sequences):
            raise errors.InvalidArgument("only_sequences", "must be 32-bit sequence numbers")
        async for _buf, raw in self.hub.fetch(
            request.from_version, request.to_version, list(request.only_sequences), request.follow
        ):
            yield segment_message(raw)

    async def Commit(self, request, context):  # noqa: N802
        if not request.HasField("order"):
            raise errors.InvalidArgument("order", "is required")
        return self.hub.commit(request.order)

    async def GetStatus(self, request, context):  # noqa: N802
        return self.hub.status()

    async def PruneCache(self, request, context):  # noqa: N802
        if request.keep_from_version < 0 or request.keep_last < 0:
            raise errors.InvalidArgument("keep_from_version", "keep_from_version and keep_last must be >= 0")
        evicted, freed = self.hub.prune(request.keep_from_version, request.keep_last)
        return relay_pb2.PruneCacheResponse(evicted=evicted, bytes_freed=freed)


def add_to_server(servicer: RelayServicer, server: aio.Server) -> None:
    relay_pb2_grpc.add_RelayServicer_to_server(servicer, server)


SERVICE_NAME = relay_pb2.DESCRIPTOR.services_by_name["Relay"].full_name
