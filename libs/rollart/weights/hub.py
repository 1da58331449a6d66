"""The segment hub shared by the relay service and the trainer's publisher.

A hub holds one :class:`~rollart.weights.hub_state.VersionBuffer` per version (``hub_state``: segments verified
and deduplicated as they arrive, followed by every reader as they fill, so a segment leaves the hub the moment it
arrived). Complete versions are written to a bounded on-disk cache (a plain ``.dseg`` file per version, readable by
``rollart delta inspect``) for catch-up and restarts; the oldest are evicted beyond the byte or version budget.

The hub also keeps the subscribers, a retained event log (versions arriving, Commit orders, draining)
that subscribers watch, and idempotent Commit propagation. ``relay_api.RelayServicer`` exposes it over gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from rollart.delta import segment as sg
from rollart.delta.errors import DeltaError
from rollart.runtime import timeutil
from rollart.v1 import common_pb2, relay_pb2

from . import transport as tp
from .hub_state import (  # HubError and VersionBuffer are imported from here by the relay and tests
    HUB_BYTES,
    HUB_CACHE_BYTES,
    HUB_REJECTED,
    HUB_VERSIONS,
    HubError,
    Subscriber,
    VersionBuffer,
    _ts,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------- the hub


class DeltaHub:
    """Buffers, cache, transport sessions, subscribers, events and commits of one job at one place."""

    def __init__(
        self,
        *,
        job: str,
        key: bytes,
        relay_id: str,
        region: str = "",
        cache_dir: Path | str | None = None,
        capacity_bytes: int = 4 << 30,
        max_versions: int = 64,
        memory_versions: int = 2,
        store_and_forward: bool = False,
        streams: int = 4,
        reconnect_timeout: float = 10.0,
        idle_timeout: float = 60.0,
        pull_wait: float = 5.0,
        event_history: int = 4096,
        subscriber_ttl: float = 30.0,
        alternatives: list[str] | None = None,
    ) -> None:
        if not key:
            raise ValueError("a hub needs the job key")
        self.job = job
        self.key = bytes(key)
        self.relay_id = relay_id
        self.region = region
        for direction in ("in", "out"):  # exported at 0 from the start: a rate, not "no data", before the first delta
            HUB_BYTES.labels(relay_id, direction)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.capacity_bytes = capacity_bytes
        self.max_versions = max_versions
        self.memory_versions = memory_versions
        self.store_and_forward = store_and_forward
        self.streams = streams
        self.reconnect_timeout = reconnect_timeout
        self.idle_timeout = idle_timeout
        self.pull_wait = pull_wait
        self.subscriber_ttl = subscriber_ttl
        self.alternatives = list(alternatives or [])
        self.versions: dict[int, VersionBuffer] = {}
        self.subscribers: dict[str, Subscriber] = {}
        self.data_endpoint = ""
        self.server: tp.TransportServer | None = None
        self.bytes_received = 0
        self.bytes_sent = 0
        self.last_segment_at: float | None = None
        self.started_at = time.time()
        self.last_commit: common_pb2.CommitOrder | None = None
        self.upstream = relay_pb2.RelayUpstreamStatus(receiving_version=-1)
        self._event_seq = 0
        self._events: deque[tuple[relay_pb2.RelayEvent, frozenset[str] | None]] = deque(maxlen=event_history)
        self._watchers: dict[str, set[asyncio.Queue]] = {}
        self._orders: OrderedDict[str, relay_pb2.RelayCommitResponse] = OrderedDict()
        self._sessions: dict[bytes, tp._Session] = {}
        self._tasks: set[asyncio.Task] = set()
        self._persisting: dict[int, asyncio.Task] = {}
        # Called before status() reports the upstream (the relay service fills in its follower's state).
        self.refresh_upstream: Callable[[], None] | None = None
        self._draining = False

    # ---------------------------------------------------------------------------------------- lifecycle

    async def start(self, data_listen: str | None = "127.0.0.1:0", advertise: str | None = None) -> None:
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(self._load_cache)
        if data_listen:
            host, _, port = data_listen.rpartition(":")
            self.server = tp.TransportServer(
                key_for=lambda job: self.key if job == self.job else None,
                admit=self._admit,
                host=host,
                port=int(port),
            )
            await self.server.start()
            self.data_endpoint = advertise or self.server.address
        self._spawn(self._reaper())

    async def drain(self, reason: str) -> None:
        """Tell every watcher to move (with the alternatives), then end their event streams."""
        if self._draining:
            return
        self._draining = True
        self.emit(relay_pb2.RelayEvent(draining=relay_pb2.RelayDraining(reason=reason, alternatives=self.alternatives)))
        await asyncio.sleep(0.05)  # let the streams carry it out
        for q in [q for qs in self._watchers.values() for q in qs]:
            q.put_nowait(None)

    async def stop(self, reason: str = "") -> None:
        if reason:
            await self.drain(reason)
        if self.server is not None:
            await self.server.stop()
        for s in list(self._sessions.values()):
            await s.close()
        for q in [q for qs in self._watchers.values() for q in qs]:
            q.put_nowait(None)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for t in list(self._persisting.values()):
            with contextlib.suppress(Exception):
                await t

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -------------------------------------------------------------------------------------------- buffers

    def buffer(self, version: int, source: str = "push") -> VersionBuffer:
        """The buffer of ``version``, created when new."""
        if version < 1:
            raise HubError("INVALID_ARGUMENT", f"version must be >= 1, got {version}")
        buf = self.versions.get(version)
        if buf is None:
            buf = self.versions[version] = VersionBuffer(self, version, source)
            HUB_VERSIONS.labels(self.relay_id).set(len(self.versions))
        return buf

    def newest(self, complete_only: bool = True) -> int | None:
        vs = [v for v, b in self.versions.items() if b.complete or (not complete_only and b.first_at is not None)]
        return max(vs) if vs else None

    def complete_versions(self) -> list[int]:
        return sorted(v for v, b in self.versions.items() if b.complete)

    async def ingest(self, raw: bytes | memoryview, *, verify: bool = True, source: str = "push") -> bool:
        """Stage one segment from anywhere (gRPC push, a local encoder). Raises DeltaError/HubError."""
        seg = sg.parse(raw, self.key if verify else None)
        if seg.job != self.job:
            raise HubError("INVALID_ARGUMENT", f"segment of job {seg.job!r}; this hub serves {self.job!r}")
        return await self.buffer(seg.version, source).put(seg)

    def _on_first(self, buf: VersionBuffer) -> None:
        self.upstream.receiving_version = buf.version
        self.emit(relay_pb2.RelayEvent(version=relay_pb2.VersionAvailable(delta=buf.cached())))
        for sub in self.subscribers.values():
            if sub.mode == relay_pb2.DELIVERY_MODE_PUSH and buf.version > sub.active_version:
                self._spawn(self._push_subscriber(sub, buf.version))

    def _on_complete(self, buf: VersionBuffer) -> None:
        if self.upstream.receiving_version == buf.version:
            self.upstream.receiving_version = -1
        log.info(
            "version %d complete at %s: %d segments, %d bytes, h(v)=%s",
            buf.version,
            self.relay_id,
            buf.tracker.received,
            buf.nbytes,
            (buf.tracker.hash or b"").hex()[:16],
        )
        self.emit(relay_pb2.RelayEvent(version=relay_pb2.VersionAvailable(delta=buf.cached())))
        if self.cache_dir is not None:
            self._persisting[buf.version] = self._spawn(self._persist(buf))
        else:
            self._evict()

    # --------------------------------------------------------------------------------------------- cache

    def _file(self, version: int) -> Path:
        assert self.cache_dir is not None
        return self.cache_dir / f"v{version:012d}.dseg"

    async def _persist(self, buf: VersionBuffer) -> None:
        seqs = buf.seqs_in_order()
        segs = [buf.segs[s] for s in seqs]
        path = self._file(buf.version)

        def write() -> dict[int, tuple[int, int]]:
            tmp = path.with_suffix(".tmp")
            index = {}
            off = 0
            with open(tmp, "wb") as f:
                for seq, raw in zip(seqs, segs):
                    f.write(raw)
                    index[seq] = (off, len(raw))
                    off += len(raw)
            os.replace(tmp, path)
            return index

        try:
            buf.index = await asyncio.to_thread(write)
            buf.path = path
            if self.versions.get(buf.version) is not buf:  # evicted while being written
                path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot cache version %d on disk: %s", buf.version, exc)
        finally:
            self._persisting.pop(buf.version, None)
        self._evict()

    def _load_cache(self) -> None:
        assert self.cache_dir is not None
        for path in sorted(self.cache_dir.glob("v*.dseg")):
            try:
                data = path.read_bytes()
                version = None
                buf = None
                off = 0
                for raw in sg.split(data):
                    seg = sg.parse(raw, self.key)
                    if version is None:
                        version = seg.version
                        if seg.job != self.job:
                            raise DeltaError(f"cached delta of job {seg.job!r}")
                        buf = VersionBuffer(self, version, "cache")
                    assert buf is not None
                    if not buf.tracker.add(seg):
                        raise DeltaError(f"duplicate segment {seg.seq}")
                    buf.order.append(seg.seq)
                    buf.index[seg.seq] = (off, len(raw))
                    off += len(raw)
                if buf is None or not buf.complete:
                    raise DeltaError("incomplete")
                buf.path = path
                buf.first_at = buf.completed_at = path.stat().st_mtime
                self.versions[buf.version] = buf
            except (DeltaError, OSError) as exc:
                log.warning("dropping cached delta %s: %s", path, exc)
                with contextlib.suppress(OSError):
                    path.unlink()
        for tmp in self.cache_dir.glob("*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()
        if self.versions:
            log.info("cache: %d versions loaded from %s", len(self.versions), self.cache_dir)

    def cache_bytes(self) -> int:
        return sum(b.nbytes for b in self.versions.values() if b.complete)

    def _evict(self) -> list[int]:
        complete = self.complete_versions()
        evicted: list[int] = []
        total = self.cache_bytes()
        while complete and (total > self.capacity_bytes or len(complete) > self.max_versions):
            v = complete.pop(0)
            if not complete and total <= self.capacity_bytes:
                break
            total -= self.versions[v].nbytes
            self._drop(v)
            evicted.append(v)
        # Old versions are read from disk; only the newest few stay in memory.
        for v in complete[: max(0, len(complete) - self.memory_versions)]:
            b = self.versions[v]
            if b.path is not None and b.segs and b.readers == 0:
                b.segs = {}
        HUB_CACHE_BYTES.labels(self.relay_id).set(self.cache_bytes())
        HUB_VERSIONS.labels(self.relay_id).set(len(self.versions))
        return evicted

    def _drop(self, version: int) -> int:
        buf = self.versions.pop(version)
        if buf.path is not None:
            with contextlib.suppress(OSError):
                buf.path.unlink()
        return buf.nbytes

    def prune(self, keep_from_version: int = 0, keep_last: int = 0) -> tuple[list[int], int]:
        complete = self.complete_versions()
        doomed = [v for v in complete if keep_from_version and v < keep_from_version]
        if keep_last > 0:
            doomed += [v for v in complete[: max(0, len(complete) - keep_last)] if v not in doomed]
        freed = sum(self._drop(v) for v in sorted(set(doomed)))
        HUB_CACHE_BYTES.labels(self.relay_id).set(self.cache_bytes())
        return sorted(set(doomed)), freed

    # ------------------------------------------------------------------------------------------ transport

    async def _admit(self, hello: tp.Hello) -> Callable[[tp.Connection], None]:
        session = self._sessions.get(hello.session_id)
        if session is not None:
            if session.streams != hello.streams or session.version != hello.version or session.finished:
                raise tp.RefusedError(f"session {hello.session_hex} does not match an open session")
        elif hello.resume:
            raise tp.RefusedError(f"session {hello.session_hex} is unknown here (expired): open a new one")
        elif hello.role == tp.ROLE_PUSH:
            buf = self.buffer(hello.version, "push")
            session = tp.ReceiverSession(
                key=self.key,
                sink=buf,
                job=self.job,
                version=hello.version,
                streams=hello.streams,
                session_id=hello.session_id,
                reconnect_timeout=self.reconnect_timeout,
                idle_timeout=self.idle_timeout,
                name=f"{self.relay_id} <- push v{hello.version} ({hello.session_hex})",
            )
            self._track(session, buf)
        else:
            buf = await self._wait_version(hello.version)
            # The session's other stripes waited for the version too: the first to get here opens the session,
            # the others join it (each opening its own sent every segment once per stripe: 2x at S = 2).
            session = self._sessions.get(hello.session_id)
            if session is None:
                session = tp.SenderSession(
                    job=self.job,
                    version=hello.version,
                    streams=hello.streams,
                    session_id=hello.session_id,
                    reconnect_timeout=self.reconnect_timeout,
                    idle_timeout=self.idle_timeout,
                    name=f"{self.relay_id} -> pull v{hello.version} ({hello.session_hex})",
                )
                self._track(session, buf)
                self._spawn(self._feed(session, buf))
            elif session.streams != hello.streams or session.version != hello.version or session.finished:
                raise tp.RefusedError(f"session {hello.session_hex} does not match an open session")
        index = hello.stream_index
        return lambda conn: session.attach(index, conn)

    async def _wait_version(self, version: int) -> VersionBuffer:
        deadline = time.monotonic() + self.pull_wait
        while True:
            buf = self.versions.get(version)
            if buf is not None and buf.first_at is not None:
                return buf
            if time.monotonic() >= deadline:
                newest = self.newest(complete_only=False)
                raise tp.RefusedError(f"version {version} is not available at {self.relay_id} (newest here: {newest})")
            await asyncio.sleep(0.02)

    def _track(self, session: tp._Session, buf: VersionBuffer) -> None:
        self._sessions[session.session_id] = session

        async def reap() -> None:
            try:
                await session.sig.wait_for(lambda: session.finished)
            finally:
                self._sessions.pop(session.session_id, None)
                if isinstance(session, tp.ReceiverSession) and session.faults:
                    HUB_REJECTED.labels(self.relay_id, "segment").inc(session.faults)

        self._spawn(reap())

    async def _feed(self, session: tp.SenderSession, buf: VersionBuffer) -> None:
        """Follow a buffer into a sending session (cut-through unless store-and-forward)."""
        sent = 0
        try:
            async for raw in buf.follow(wait_complete=self.store_and_forward):
                if session.finished:
                    break
                await session.send(raw)
        except (tp.TransportError, HubError) as exc:
            log.info("feed of v%d ended: %s", buf.version, exc)
        finally:
            with contextlib.suppress(Exception):
                await session.sig.wait_for(lambda: session.finished)
            sent = session.payload_bytes
            self.bytes_sent += sent
            HUB_BYTES.labels(self.relay_id, "out").inc(sent)

    async def push_version(
        self,
        endpoint: str,
        version: int,
        *,
        streams: int | None = None,
        attempts: int = 3,
        timeout: float | None = None,
    ) -> tp.SendStats:
        """Push a buffered (or still arriving) version to a receiver's data endpoint, cut-through."""
        buf = self.versions.get(version)
        if buf is None:
            raise HubError("NOT_FOUND", f"version {version} is not at {self.relay_id}")
        last: BaseException | None = None
        t0 = time.perf_counter()
        resent = reconnects = segments = payload = wire = 0
        for attempt in range(attempts):
            try:
                session = await tp.open_push(
                    endpoint,
                    job=self.job,
                    key=self.key,
                    version=version,
                    streams=streams or self.streams,
                    early_data=attempt == 0,  # a retry's receiver may hold part of it: wait for its RESUME
                    reconnect_timeout=self.reconnect_timeout,
                    idle_timeout=self.idle_timeout,
                )
            except (tp.TransportError, OSError) as exc:
                last = exc
                if isinstance(exc, tp.AuthenticationError | tp.UnknownJobError):
                    break
                await asyncio.sleep(0.2)
                continue
            feeder = asyncio.ensure_future(self._feed_push(session, buf))
            try:
                digest = await session.finish(timeout)
            except tp.TransportError as exc:
                last = exc
                continue
            finally:
                feeder.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await feeder
                await session.close()
                segments += session.segments_sent
                resent += session.segments_resent
                payload += session.payload_bytes
                wire += session.bytes_out
                reconnects += session.reconnects
                self.bytes_sent += session.payload_bytes
                HUB_BYTES.labels(self.relay_id, "out").inc(session.payload_bytes)
            return tp.SendStats(
                endpoint,
                version,
                streams or self.streams,
                segments,
                resent,
                payload,
                wire,
                reconnects,
                time.perf_counter() - t0,
                digest,
            )
        raise tp.SessionError(f"pushing version {version} to {endpoint} failed: {last}")

    async def _feed_push(self, session: tp.SenderSession, buf: VersionBuffer) -> None:
        async for raw in buf.follow(wait_complete=self.store_and_forward):
            if session.finished:
                return
            await session.send(raw)

    async def _push_subscriber(self, sub: Subscriber, version: int) -> None:
        try:
            stats = await self.push_version(sub.endpoint, version, streams=sub.streams)
            sub.bytes_sent += stats.payload_bytes
            sub.sent_version = max(sub.sent_version, version)
            sub.connected = True
        except (tp.TransportError, HubError, OSError) as exc:
            sub.connected = False
            log.warning("push of v%d to %s failed: %s", version, sub.subscriber_id, exc)

    # ------------------------------------------------------------------------------------------ catch-up

    def chain(self, from_version: int, to_version: int, follow: bool) -> list[VersionBuffer]:
        """Buffers D_{from+1} .. D_to linked by their base versions (HubError when not servable)."""
        if from_version < 0 or to_version < 0:
            raise HubError("INVALID_ARGUMENT", "versions must be >= 0")
        if to_version == 0:
            newest = self.newest(complete_only=not follow)
            if newest is None:
                raise HubError("NOT_FOUND", f"no delta is cached at {self.relay_id}")
            to_version = newest
        if to_version <= from_version:
            if to_version < from_version:
                raise HubError("INVALID_ARGUMENT", f"to_version {to_version} is below from_version {from_version}")
            return []
        target = self.versions.get(to_version)
        if target is None or target.first_at is None:
            raise HubError("NOT_FOUND", f"version {to_version} is unknown at {self.relay_id}")
        by_base: dict[int, VersionBuffer] = {}
        for b in self.versions.values():
            if b.base_version is not None and b.first_at is not None:
                cur = by_base.get(b.base_version)
                if cur is None or b.version < cur.version:
                    by_base[b.base_version] = b
        out: list[VersionBuffer] = []
        cur_v = from_version
        while cur_v < to_version:
            nxt = by_base.get(cur_v)
            if nxt is None or nxt.version > to_version:
                oldest = min(by_base, default=None)  # the keys are the cached deltas' base versions
                raise HubError(
                    "OUT_OF_RANGE",
                    f"the delta based on version {cur_v} is not cached at {self.relay_id} (oldest cached base: "
                    f"{oldest}): load a full checkpoint first",
                )
            if not nxt.complete and not follow:
                raise HubError("FAILED_PRECONDITION", f"version {nxt.version} is still arriving (set follow)")
            out.append(nxt)
            cur_v = nxt.version
        return out

    async def fetch(
        self, from_version: int, to_version: int, only_sequences: list[int] | None = None, follow: bool = False
    ) -> AsyncIterator[tuple[VersionBuffer, bytes | bytearray]]:
        """Segments of the chain, version by version, each complete version in sequence order."""
        bufs = self.chain(from_version, to_version, follow)
        for i, buf in enumerate(bufs):
            only = set(only_sequences) if (i == 0 and only_sequences) else None
            async for raw in buf.follow(ordered=True):
                if only is not None and tp.seq_of(raw) not in only:
                    continue
                self.bytes_sent += len(raw)
                HUB_BYTES.labels(self.relay_id, "out").inc(len(raw))
                yield buf, raw

    # ------------------------------------------------------------------------------------- subscribers

    def subscribe(self, req: relay_pb2.RelaySubscribeRequest) -> relay_pb2.RelaySubscribeResponse:
        if not req.subscriber_id or len(req.subscriber_id) > 256:
            raise HubError("INVALID_ARGUMENT", "subscriber_id must be 1..256 characters")
        if req.streams < 0 or req.streams > tp.MAX_STREAMS:
            raise HubError("INVALID_ARGUMENT", f"streams must be 0..{tp.MAX_STREAMS}")
        if req.receive_endpoint:
            host, sep, port = req.receive_endpoint.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise HubError("INVALID_ARGUMENT", f"receive_endpoint must be HOST:PORT, got {req.receive_endpoint!r}")
        sub = self.subscribers.get(req.subscriber_id)
        if sub is None:
            kind = req.kind or relay_pb2.RELAY_SUBSCRIBER_KIND_ACTOR
            sub = self.subscribers[req.subscriber_id] = Subscriber(req.subscriber_id, kind)
        sub.kind = req.kind or relay_pb2.RELAY_SUBSCRIBER_KIND_ACTOR
        sub.region = req.region
        sub.mode = relay_pb2.DELIVERY_MODE_PUSH if req.receive_endpoint else relay_pb2.DELIVERY_MODE_PULL
        sub.endpoint = req.receive_endpoint
        sub.streams = req.streams or self.streams
        sub.control_endpoint = req.control_endpoint
        sub.has_active = req.has_active_version
        sub.active_version = req.active_version if req.has_active_version else -1
        sub.staged = set(req.staged_versions)
        sub.last_seen = time.time()
        complete = self.complete_versions()
        catch_up = [v for v in complete if v > sub.active_version and v not in sub.staged]
        needs_checkpoint = False
        if sub.has_active and catch_up:
            try:
                self.chain(sub.active_version, catch_up[-1], follow=False)
            except HubError:
                needs_checkpoint = True
        if needs_checkpoint:
            catch_up = []
        for v in catch_up:
            self.emit(
                relay_pb2.RelayEvent(version=relay_pb2.VersionAvailable(delta=self.versions[v].cached())),
                targets=frozenset([sub.subscriber_id]),
            )
            if sub.mode == relay_pb2.DELIVERY_MODE_PUSH:
                self._spawn(self._push_subscriber(sub, v))
        return relay_pb2.RelaySubscribeResponse(
            relay_id=self.relay_id,
            region=self.region,
            data_endpoint=self.data_endpoint,
            streams=sub.streams,
            mode=sub.mode,
            catch_up_versions=catch_up,
            needs_checkpoint=needs_checkpoint,
            ttl=timeutil.duration(int(self.subscriber_ttl)),
        )

    def unsubscribe(self, subscriber_id: str) -> None:
        self.subscribers.pop(subscriber_id, None)
        for q in self._watchers.pop(subscriber_id, set()):
            q.put_nowait(None)

    async def _reaper(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.time()
            for sid, sub in list(self.subscribers.items()):
                if sub.watchers == 0 and now - sub.last_seen > self.subscriber_ttl:
                    log.info("subscription of %s lapsed", sid)
                    self.subscribers.pop(sid, None)

    # -------------------------------------------------------------------------------------------- events

    def emit(self, event: relay_pb2.RelayEvent, targets: frozenset[str] | None = None) -> relay_pb2.RelayEvent:
        self._event_seq += 1
        event.sequence = self._event_seq
        event.at.CopyFrom(timeutil.timestamp(time.time()))
        self._events.append((event, targets))
        for sid, queues in self._watchers.items():
            if targets is None or sid in targets:
                for q in queues:
                    q.put_nowait(event)
        return event

    async def watch(
        self, subscriber_id: str, from_sequence: int = 0, only_new: bool = False
    ) -> AsyncIterator[relay_pb2.RelayEvent]:
        sub = self.subscribers.get(subscriber_id)
        if sub is None:
            raise HubError("FAILED_PRECONDITION", f"{subscriber_id!r} is not subscribed here (call Subscribe first)")
        q: asyncio.Queue = asyncio.Queue()
        self._watchers.setdefault(subscriber_id, set()).add(q)
        sub.watchers += 1
        try:
            if not only_new:
                for event, targets in list(self._events):
                    if event.sequence > from_sequence and (targets is None or subscriber_id in targets):
                        q.put_nowait(event)
            while True:
                event = await q.get()
                if event is None:
                    return
                sub.last_seen = time.time()
                if event.HasField("commit"):
                    sub.committed_version = max(sub.committed_version, event.commit.version)
                yield event
        finally:
            sub.watchers -= 1
            sub.last_seen = time.time()
            qs = self._watchers.get(subscriber_id)
            if qs is not None:
                qs.discard(q)
                if not qs:
                    self._watchers.pop(subscriber_id, None)

    # ------------------------------------------------------------------------------------------- commits

    def commit(self, order: common_pb2.CommitOrder) -> relay_pb2.RelayCommitResponse:
        if not order.order_id:
            raise HubError("INVALID_ARGUMENT", "order.order_id is required (commits are idempotent per order)")
        if order.version < 1:
            raise HubError("INVALID_ARGUMENT", f"order.version must be >= 1, got {order.version}")
        if order.hash and len(order.hash) != 32:
            raise HubError("INVALID_ARGUMENT", "order.hash must be 32 bytes (SHA-256) or empty")
        if order.order_id in self._orders:
            prev = self._orders[order.order_id]
            return relay_pb2.RelayCommitResponse(delivered=prev.delivered, undelivered=prev.undelivered, duplicate=True)
        relays = {s for s, sub in self.subscribers.items() if sub.kind == relay_pb2.RELAY_SUBSCRIBER_KIND_RELAY}
        if order.actor_ids:
            targets: frozenset[str] | None = frozenset(order.actor_ids) | relays
            wanted = set(targets)  # type: ignore[arg-type]
        else:
            targets = None
            wanted = set(self.subscribers)
        self.emit(relay_pb2.RelayEvent(commit=order), targets=targets)
        delivered = sorted(s for s in wanted if s in self._watchers)
        undelivered = sorted(wanted - set(delivered))
        resp = relay_pb2.RelayCommitResponse(delivered=delivered, undelivered=undelivered)
        self._orders[order.order_id] = resp
        while len(self._orders) > 10_000:
            self._orders.popitem(last=False)
        self.last_commit = order
        return resp

    # -------------------------------------------------------------------------------------------- status

    def receiving_sessions(self) -> int:
        return sum(1 for s in self._sessions.values() if isinstance(s, tp.ReceiverSession) and not s.finished)

    def status(self) -> relay_pb2.RelayStatus:
        if self.refresh_upstream is not None:
            self.refresh_upstream()
        for sub in self.subscribers.values():
            if sub.mode == relay_pb2.DELIVERY_MODE_PULL:
                sub.connected = sub.watchers > 0
        return relay_pb2.RelayStatus(
            relay_id=self.relay_id,
            region=self.region,
            data_endpoint=self.data_endpoint,
            upstream=self.upstream,
            cached=[self.versions[v].cached() for v in sorted(self.versions) if self.versions[v].first_at],
            subscribers=[s.proto() for s in self.subscribers.values()],
            cache_bytes=self.cache_bytes(),
            cache_capacity_bytes=self.capacity_bytes,
            bytes_sent=self.bytes_sent,
            last_commit=self.last_commit,
            started_at=_ts(self.started_at),
        )
