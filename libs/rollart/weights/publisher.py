"""The weight publisher (used by the trainer service): make version ``v`` available everywhere.

``publish(v, weights)`` writes a full checkpoint every ``checkpoint_every`` versions, streams the sparse delta
``D_v`` to the relays while it is being extracted (each sealed segment enters the publisher's hub, which every
relay's push session follows), and puts Mooncake buckets when configured. The hub also serves the Relay API, so
actors fall back to the trainer. docs/weight-plane.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from rollart.delta import DeltaEncoder, WeightSet, weights_digest
from rollart.delta import segment as sg
from rollart.delta.safetensors_io import JOB_KEY
from rollart.runtime import errors, ids
from rollart.runtime.auth import TokenAuthInterceptor
from rollart.runtime.client import channel as make_channel
from rollart.runtime.config import TLSConfig
from rollart.v1 import common_pb2, relay_pb2, relay_pb2_grpc

from . import transport as tp
from .hub import DeltaHub
from .relay_api import RelayServicer

log = logging.getLogger(__name__)


@dataclass
class RelayResult:
    endpoint: str
    data_endpoint: str = ""
    ok: bool = False
    seconds: float = 0.0
    payload_bytes: int = 0
    wire_bytes: int = 0
    resent: int = 0
    error: str = ""


@dataclass
class PublishResult:
    version: int
    base_version: int | None
    hash: bytes | None  # h(v) of D_v (None when only a checkpoint was written)
    weights_hash: bytes | None = None  # identity of version v: h(v) of D_v, or the weights digest of a first version
    delta_bytes: int = 0
    segments: int = 0
    entries: int = 0
    encode_seconds: float = 0.0  # extraction + encoding (the worker thread)
    first_segment_seconds: float | None = None  # from the start until the first segment was sealed
    relay_seconds: float = 0.0  # until the last relay verified the whole delta
    total_seconds: float = 0.0
    checkpoint: Any = None  # CheckpointInfo when one was written
    checkpoint_seconds: float = 0.0
    buckets: list[str] = field(default_factory=list)
    relays: list[RelayResult] = field(default_factory=list)

    @property
    def egress_bytes(self) -> int:
        return sum(r.wire_bytes for r in self.relays)


class Publisher:
    def __init__(
        self,
        *,
        job: str,
        key: bytes,
        token: str | None = None,
        relays: Sequence[str] = (),
        streams: int = 4,
        checkpoint_store: Any = None,
        checkpoint_every: int = 10,
        buckets: Any = None,
        bucket_bytes: int = 1 << 30,
        max_segment_bytes: int = sg.DEFAULT_MAX_SEGMENT_BYTES,
        tls: TLSConfig | None = None,
        cache_dir: Path | str | None = None,
        cache_capacity_bytes: int = 2 << 30,
        cache_max_versions: int = 16,
        data_listen: str | None = "127.0.0.1:0",
        grpc_listen: str | None = None,
        publisher_id: str = "trainer",
        reconnect_timeout: float = 10.0,
        relay_timeout: float | None = 600.0,
        relay_data_endpoints: dict[str, str] | None = None,
        format_version: int = sg.FORMAT_VERSION,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be >= 1")
        if isinstance(checkpoint_store, str | os.PathLike):
            from .checkpoint_store import open_store

            checkpoint_store = open_store(checkpoint_store)
        self.job, self.key, self.token, self.tls = job, bytes(key), token, tls
        self.relays = list(relays)
        self.streams = streams
        self.store = checkpoint_store
        self.checkpoint_every = checkpoint_every
        if isinstance(buckets, str):  # a Mooncake master address
            from .buckets import BucketPublisher

            buckets = BucketPublisher(buckets, job, bucket_bytes=bucket_bytes)
        self.buckets = buckets  # a buckets.BucketPublisher (or anything with publish(version, weights))
        self.max_segment_bytes = max_segment_bytes
        self.format_version = format_version  # of the deltas; segments are opaque to hubs and relays
        self.data_listen = data_listen
        self.grpc_listen = grpc_listen
        self.relay_timeout = relay_timeout
        self.hub = DeltaHub(
            job=job,
            key=self.key,
            relay_id=publisher_id,
            cache_dir=cache_dir,
            capacity_bytes=cache_capacity_bytes,
            max_versions=cache_max_versions,
            streams=streams,
            reconnect_timeout=reconnect_timeout,
        )
        self.servicer = RelayServicer(self.hub)
        self.grpc_endpoint = ""
        self._server: aio.Server | None = None
        # gRPC endpoint -> striped-transport endpoint; learnt from GetStatus unless given (e.g. a proxy).
        self._data_endpoints: dict[str, str] = dict(relay_data_endpoints or {})
        self._pinned = set(self._data_endpoints)
        self._prev: WeightSet | None = None
        self._lock = asyncio.Lock()
        self.published: list[PublishResult] = []

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self, previous: WeightSet | None = None) -> None:
        """Start the hub (and the gRPC server when ``grpc_listen`` is set).

        ``previous``: weights already published (a restarted trainer), the base of the next delta.
        """
        await self.hub.start(self.data_listen)
        if previous is not None:
            if previous.version is None:
                raise ValueError("previous weights need their version")
            self._prev = previous.copy()
            if self._prev.applied_hash is None:  # the base of the next delta must know its identity h(v)
                log.warning(
                    "previous weights v%d record no hash: taking their digest (a first version)", previous.version
                )
                self._prev.applied_hash = await asyncio.to_thread(weights_digest, self._prev.arrays, self._prev.dtypes)
        if self.grpc_listen:
            # Auth first, then the status mapping of what the Relay servicer raises.
            interceptors: list[aio.ServerInterceptor] = [TokenAuthInterceptor(self.token)] if self.token else []
            interceptors.append(errors.StatusInterceptor())
            self._server = aio.server(
                interceptors=interceptors,
                options=[("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)],
            )
            self.add_to_server(self._server)
            port = self._server.add_insecure_port(self.grpc_listen)
            await self._server.start()
            self.grpc_endpoint = f"{self.grpc_listen.rpartition(':')[0]}:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0.5)
        await self.hub.stop()
        close = getattr(self.buckets, "close", None)
        if close is not None:
            await asyncio.to_thread(close)

    def add_to_server(self, server: aio.Server) -> None:
        """Serve the Relay API (fallback source for actors) on the trainer's own gRPC server."""
        relay_pb2_grpc.add_RelayServicer_to_server(self.servicer, server)

    @property
    def data_endpoint(self) -> str:
        return self.hub.data_endpoint

    @property
    def version(self) -> int | None:
        return None if self._prev is None else self._prev.version

    # ----------------------------------------------------------------------------------------- publishing

    async def publish(self, version: int, weights: WeightSet) -> PublishResult:
        """Publish ``weights`` as ``version`` (see the module docstring). Returns when every relay has
        verified ``D_v`` (or failed: see ``RelayResult.error``) and the checkpoint is committed."""
        async with self._lock:
            return await self._publish(version, weights)

    async def _publish(self, version: int, weights: WeightSet) -> PublishResult:
        t0 = time.perf_counter()
        prev = self._prev
        if prev is not None and version <= (prev.version or 0):
            raise ValueError(f"version {version} is not newer than the last published {prev.version}")
        snap = weights.copy()  # the trainer keeps training in place; publish a consistent snapshot
        snap.version = version
        snap.metadata[JOB_KEY] = self.job  # checkpoints record job, version and hash (rollart.* metadata)
        if prev is None:
            # A first version: no delta made it, its identity is its digest (the base hash D_{v+1} names).
            snap.applied_hash = await asyncio.to_thread(weights_digest, snap.arrays, snap.dtypes)
        result = PublishResult(version, None if prev is None else prev.version, None)
        jobs: list[asyncio.Future] = []
        want_ckpt = self.store is not None and (prev is None or version % self.checkpoint_every == 0)
        delta_hash = asyncio.Event()  # set once the delta's h(v) is in snap.applied_hash (or the delta failed)
        if prev is not None:
            delta_job = asyncio.ensure_future(self._stream_delta(prev, snap, result, t0, delta_hash))
            delta_job.add_done_callback(lambda _: delta_hash.set())
            jobs.append(delta_job)
        else:
            delta_hash.set()
        if self.buckets is not None:
            jobs.append(asyncio.ensure_future(self._buckets(version, snap, result, delta_hash)))
        if jobs:
            # The delta's hash goes into the checkpoint's metadata, so the checkpoint waits for it.
            await asyncio.gather(*jobs)
        result.weights_hash = snap.applied_hash
        if want_ckpt:
            c0 = time.perf_counter()
            meta = {"job": self.job, "hash": snap.applied_hash.hex() if snap.applied_hash else ""}
            result.checkpoint = await asyncio.to_thread(self.store.put, version, snap, exist_ok=True, metadata=meta)
            result.checkpoint_seconds = time.perf_counter() - c0
        self._prev = snap
        result.total_seconds = time.perf_counter() - t0
        self.published.append(result)
        log.info(
            "published v%d: delta %d bytes in %d segments, relays %s, checkpoint %s",
            version,
            result.delta_bytes,
            result.segments,
            {r.endpoint: r.ok for r in result.relays},
            bool(result.checkpoint),
        )
        return result

    async def _stream_delta(
        self, prev: WeightSet, snap: WeightSet, result: PublishResult, t0: float, hash_known: asyncio.Event
    ) -> None:
        version = snap.version
        assert version is not None
        buf = self.hub.buffer(version, "trainer")
        pushes = [asyncio.ensure_future(self._push(ep, version)) for ep in self.relays]
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue(maxsize=8)
        cancel = threading.Event()

        def produce() -> DeltaEncoder:
            enc = DeltaEncoder(
                prev,
                snap,
                job=self.job,
                version=version,
                key=self.key,
                base_version=prev.version,
                max_segment_bytes=self.max_segment_bytes,
                format_version=self.format_version,
                base_hash=prev.applied_hash,
            )
            item: object = None
            try:
                for seg in enc.segments():
                    _put(seg)
            except BaseException as exc:  # noqa: BLE001 - handed to the event loop
                item = exc
            _put(item)
            return enc

        def _put(item: object) -> None:
            fut = asyncio.run_coroutine_threadsafe(q.put(item), loop)
            while not cancel.is_set():
                try:
                    fut.result(timeout=0.5)
                    return
                except TimeoutError:
                    continue
            fut.cancel()

        e0 = time.perf_counter()
        producer = asyncio.ensure_future(asyncio.to_thread(produce))
        try:
            while True:
                item = await q.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                if result.first_segment_seconds is None:
                    result.first_segment_seconds = time.perf_counter() - t0
                await buf.put(sg.parse(item, None))
            enc = await producer
        except BaseException:
            cancel.set()
            for p in pushes:
                p.cancel()
            raise
        result.encode_seconds = time.perf_counter() - e0
        w = enc.writer
        result.hash = w.hash
        result.delta_bytes = w.total_bytes
        result.segments = w.segment_count + 1
        result.entries = w.total_entries
        snap.applied_hash = w.hash
        hash_known.set()
        result.relays = list(await asyncio.gather(*pushes))
        result.relay_seconds = time.perf_counter() - t0

    async def _data_endpoint(self, relay: str, refresh: bool = False) -> str:
        if relay not in self._data_endpoints or (refresh and relay not in self._pinned):
            ch = make_channel(relay, token=self.token, tls=self.tls, default_timeout=5.0)
            try:
                st = await relay_pb2_grpc.RelayStub(ch).GetStatus(relay_pb2.RelayStatusRequest())
            finally:
                await ch.close(grace=None)
            if not st.data_endpoint:
                raise tp.TransportError(f"relay {relay} reports no data endpoint")
            self._data_endpoints[relay] = st.data_endpoint
        return self._data_endpoints[relay]

    async def _push(self, relay: str, version: int) -> RelayResult:
        res = RelayResult(relay)
        t0 = time.perf_counter()
        for attempt in range(2):
            try:
                res.data_endpoint = await self._data_endpoint(relay, refresh=attempt > 0)
                stats = await self.hub.push_version(
                    res.data_endpoint, version, streams=self.streams, timeout=self.relay_timeout
                )
                res.ok = True
                res.payload_bytes += stats.payload_bytes
                res.wire_bytes += stats.wire_bytes
                res.resent += stats.resent
                res.error = ""
                break
            except (tp.TransportError, grpc.aio.AioRpcError, OSError) as exc:
                res.error = (exc.details() or "") if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                log.warning("pushing v%d to relay %s failed: %s", version, relay, res.error)
        res.seconds = time.perf_counter() - t0
        return res

    async def _buckets(self, version: int, snap: WeightSet, result: PublishResult, hash_known: asyncio.Event) -> None:
        """Buckets beside the delta: packed and written at once, committed once the manifest can name the
        version's h(v) (the delta's hash; before it is known ``snap.applied_hash`` is the trainer's stale one,
        and actors would refuse the pulled weights as DATA_LOSS)."""
        pub = self.buckets
        if not (hasattr(pub, "prepare") and hasattr(pub, "commit")):
            await hash_known.wait()
            manifest = await asyncio.to_thread(pub.publish, version, snap)
        else:
            prepared = await asyncio.to_thread(pub.prepare, version, snap)
            await hash_known.wait()
            if snap.applied_hash is None or result.hash is None and result.base_version is not None:
                await asyncio.to_thread(pub.discard, prepared)  # the delta failed: its error ends the publish
                return
            prepared.manifest = dataclasses.replace(prepared.manifest, applied_hash=snap.applied_hash.hex())
            manifest = await asyncio.to_thread(pub.commit, prepared)
        result.buckets = [b.key for b in getattr(manifest, "buckets", ())]

    # --------------------------------------------------------------------------------------------- commit

    async def commit(
        self,
        version: int,
        *,
        order_id: str | None = None,
        actor_ids: Sequence[str] = (),
        step: int = 0,
        fetch_if_missing: bool = True,
    ) -> dict[str, relay_pb2.RelayCommitResponse | str]:
        """Send Commit(v) to every relay and to the actors following the trainer directly."""
        pub = next((p for p in reversed(self.published) if p.version == version), None)
        order = common_pb2.CommitOrder(
            order_id=order_id or ids.new_id(f"{self.job}-v{version}", nbytes=6),
            version=version,
            hash=(pub.hash or b"") if pub else b"",
            base_version=(pub.base_version or 0) if pub else 0,
            step=step,
            actor_ids=list(actor_ids),
            fetch_if_missing=fetch_if_missing,
        )
        order.issued_at.GetCurrentTime()
        out: dict[str, relay_pb2.RelayCommitResponse | str] = {"trainer": self.hub.commit(order)}

        async def one(relay: str) -> None:
            ch = make_channel(
                relay, token=self.token, tls=self.tls, default_timeout=5.0, idempotent=["rollart.v1.Relay"]
            )
            try:
                out[relay] = await relay_pb2_grpc.RelayStub(ch).Commit(relay_pb2.RelayCommitRequest(order=order))
            except grpc.aio.AioRpcError as exc:
                out[relay] = f"{exc.code().name}: {exc.details()}"
            finally:
                await ch.close(grace=None)

        await asyncio.gather(*(one(r) for r in self.relays))
        return out

    async def __aenter__(self) -> Publisher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self.stop()
