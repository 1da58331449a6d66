"""Following a relay-like source: subscribe, watch its events, pull every new version, fail over.

A *source* is any endpoint serving ``rollart.v1.Relay`` (a relay, or the trainer's publisher). The
follower subscribes, holds the event stream, and for each version announced that its owner still wants
opens a striped pull session into the owner's sink. When the source fails (event stream broken, a pull
session that cannot reconnect, the relay draining) it moves to the next endpoint in its list and resumes
every incomplete version there: the RESUME of the new session names only the segments still missing,
so each segment is staged once. On a fallback it goes back to the first endpoint (the relay of its own
region) once that answers and holds every version still being pulled. Commit orders are handed to ``on_commit``.

Used by the subscriber library (actors; sinks are delta stagers) and by relays that follow an upstream
relay (sinks are the relay's own buffers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc

from rollart.runtime.client import channel as make_channel
from rollart.runtime.config import TLSConfig
from rollart.v1 import common_pb2, relay_pb2, relay_pb2_grpc

from . import transport as tp

log = logging.getLogger(__name__)

SinkFor = Callable[[int], "tp.SegmentSink | None"]
StateFn = Callable[[], tuple[bool, int, list[int]]]  # (has weights, active version, complete staged versions)


class _SourceFailed(Exception):
    pass


class SourceFollower:
    def __init__(
        self,
        *,
        subscriber_id: str,
        kind: relay_pb2.RelaySubscriberKind,
        job: str,
        key: bytes,
        token: str | None,
        endpoints: Sequence[str],
        sink_for: SinkFor,
        state: StateFn,
        on_commit: Callable[[common_pb2.CommitOrder], Awaitable[None]] | None = None,
        on_needs_checkpoint: Callable[[], Awaitable[None]] | None = None,
        streams: int = 4,
        region: str = "",
        tls: TLSConfig | None = None,
        reconnect_timeout: float = 3.0,
        idle_timeout: float = 30.0,
        rpc_timeout: float = 5.0,
        prefer_first_after: float = 15.0,
    ) -> None:
        if not endpoints:
            raise ValueError("a follower needs at least one source endpoint")
        self.subscriber_id = subscriber_id
        self.kind = kind
        self.job, self.key, self.token = job, key, token
        self.endpoints = list(endpoints)
        self.sink_for = sink_for
        self.state = state
        self.on_commit = on_commit
        self.on_needs_checkpoint = on_needs_checkpoint
        self.streams = streams
        self.region = region
        self.tls = tls
        self.reconnect_timeout = reconnect_timeout
        self.idle_timeout = idle_timeout
        self.rpc_timeout = rpc_timeout
        self.prefer_first_after = prefer_first_after  # 0: stay on a fallback source
        self._back_to_first = False
        self.index = 0
        self.active_endpoint = ""
        self.data_endpoint = ""
        self.connected = False
        self.failovers = 0
        self.last_error = ""
        self.pull_bytes = 0
        self.connected_event = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._pulls: dict[int, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._failure: asyncio.Future | None = None
        self._stub: relay_pb2_grpc.RelayStub | None = None
        self._wanted: set[int] = set()

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        for t in list(self._tasks) + list(self._pulls.values()):
            t.cancel()
        await asyncio.gather(*self._tasks, *self._pulls.values(), return_exceptions=True)
        self._pulls.clear()

    def set_endpoints(self, endpoints: Sequence[str]) -> None:
        """New source list (takes effect at the next failover, or now when not connected)."""
        if not endpoints:
            raise ValueError("at least one endpoint")
        self.endpoints = list(endpoints)
        self.index = 0

    def switch(self) -> None:
        """Leave the current source now (e.g. the owner saw it misbehave)."""
        if self._failure is not None and not self._failure.done():
            self._failure.set_result(_SourceFailed("switch requested"))

    def pulling(self, version: int) -> bool:
        """Whether a pull session for ``version`` is under way (its segments may still come)."""
        task = self._pulls.get(version)
        return task is not None and not task.done()

    def _spawn(self, coro: Awaitable) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------------------------------ following

    async def _run(self) -> None:
        tried = 0
        while True:
            ep = self.endpoints[self.index % len(self.endpoints)]
            try:
                await self._follow(ep)
                self.last_error = f"{ep}: event stream ended"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure moves to the next source
                self.last_error = f"{ep}: {_describe(exc)}"
            self.connected = False
            self.connected_event.clear()
            if self._back_to_first:
                self._back_to_first = False
                self.index, tried = 0, 0
                log.info("%s: back to source %s (%s)", self.subscriber_id, self.endpoints[0], self.last_error)
                continue
            log.warning("%s: leaving source %s (%s)", self.subscriber_id, ep, self.last_error)
            self.index += 1
            self.failovers += 1
            tried += 1
            # A full round of failures backs off; a single switch is immediate.
            await asyncio.sleep(0.5 if tried % len(self.endpoints) == 0 else 0.0)

    async def _follow(self, endpoint: str) -> None:
        ch = make_channel(endpoint, token=self.token, tls=self.tls, default_timeout=self.rpc_timeout)
        loop = asyncio.get_running_loop()
        self._failure = loop.create_future()
        try:
            stub = relay_pb2_grpc.RelayStub(ch)
            has, active, staged = self.state()
            resp = await stub.Subscribe(
                relay_pb2.RelaySubscribeRequest(
                    subscriber_id=self.subscriber_id,
                    kind=self.kind,
                    region=self.region,
                    streams=self.streams,
                    has_active_version=has,
                    active_version=active,
                    staged_versions=staged,
                ),
                timeout=self.rpc_timeout,
            )
            self._stub = stub
            self.data_endpoint = resp.data_endpoint
            self.active_endpoint = endpoint
            self.connected = True
            self.connected_event.set()
            log.info("%s: following %s (data %s)", self.subscriber_id, endpoint, resp.data_endpoint)
            if resp.needs_checkpoint and self.on_needs_checkpoint is not None:
                self._spawn(self.on_needs_checkpoint())
            for v in sorted(set(resp.catch_up_versions) | self._wanted):
                self._want(v)
            watch = stub.WatchEvents(relay_pb2.WatchRelayEventsRequest(subscriber_id=self.subscriber_id))
            events = asyncio.ensure_future(self._events(watch))
            if endpoint != self.endpoints[0] and self.prefer_first_after > 0:
                probe = self._spawn(self._probe_first())
                self._failure.add_done_callback(lambda _f: probe.cancel())
            done, _ = await asyncio.wait({events, self._failure}, return_when=asyncio.FIRST_COMPLETED)
            if events in done:
                events.result()  # raises the stream's error
            else:
                events.cancel()
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await events
                raise self._failure.result()
        finally:
            self._stub = None
            for t in list(self._pulls.values()):
                t.cancel()
            await asyncio.gather(*self._pulls.values(), return_exceptions=True)
            self._pulls.clear()
            await ch.close(grace=None)

    async def _probe_first(self) -> None:
        """On a fallback source (often the trainer, across the link): go back to the first source (the relay in
        the owner's region) once it answers and holds, complete, every version still being pulled, instead of
        staying on the fallback, with every version crossing the link once per follower, for the rest of the run.
        A pull under way resumes there with only its missing segments."""
        first = self.endpoints[0]
        while True:
            await asyncio.sleep(self.prefer_first_after)
            ch = make_channel(first, token=self.token, tls=self.tls, default_timeout=self.rpc_timeout)
            try:
                st = await relay_pb2_grpc.RelayStub(ch).GetStatus(
                    relay_pb2.RelayStatusRequest(), timeout=self.rpc_timeout
                )
            except grpc.aio.AioRpcError:
                continue
            finally:
                await ch.close(grace=None)
            if self._wanted - {c.version for c in st.cached if c.complete}:
                continue  # it lacks a version being pulled (its own upstream may still be down)
            if self._failure is not None and not self._failure.done():
                self._back_to_first = True
                self._failure.set_result(_SourceFailed(f"the first source {first} answers again"))
            return

    async def _events(self, watch) -> None:
        async for ev in watch:
            kind = ev.WhichOneof("event")
            if kind == "version":
                self._want(ev.version.delta.version)
            elif kind == "commit" and self.on_commit is not None:
                self._spawn(self._commit(ev.commit))
            elif kind == "draining":
                raise _SourceFailed(f"source is draining: {ev.draining.reason}")

    async def _commit(self, order: common_pb2.CommitOrder) -> None:
        try:
            await self.on_commit(order)  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - the owner records it; following goes on
            log.warning("%s: commit %s (v%d) failed: %s", self.subscriber_id, order.order_id, order.version, exc)

    def _want(self, version: int) -> None:
        task = self._pulls.get(version)
        if task is not None and not task.done():
            return
        sink = self.sink_for(version)
        if sink is None or sink.tracker.complete:
            self._wanted.discard(version)
            return
        self._wanted.add(version)
        self._pulls[version] = asyncio.ensure_future(self._pull(version, sink))

    async def _pull(self, version: int, sink: tp.SegmentSink) -> None:
        data = self.data_endpoint
        try:
            session = await tp.open_pull(
                data,
                job=self.job,
                key=self.key,
                version=version,
                sink=sink,
                streams=self.streams,
                reconnect_timeout=self.reconnect_timeout,
                idle_timeout=self.idle_timeout,
            )
            try:
                await session.wait()
            finally:
                self.pull_bytes += session.bytes_in
                await session.close()
            self._wanted.discard(version)
        except tp.RefusedError as exc:
            # Not here (yet): the next VersionAvailable from this source starts it again.
            log.info("%s: v%d not available at %s: %s", self.subscriber_id, version, data, exc)
        except (tp.TransportError, OSError) as exc:
            if self._failure is not None and not self._failure.done():
                self._failure.set_result(_SourceFailed(f"pull of v{version} from {data} failed: {exc}"))

    # ----------------------------------------------------------------------------------------- catch-up

    async def fetch(
        self, from_version: int, to_version: int, only_sequences: Sequence[int] = (), follow: bool = False
    ) -> AsyncIterator[common_pb2.DeltaSegment]:
        """FetchDeltas from the current source (or, when not connected, the endpoints in order)."""
        order = [self.active_endpoint] if self.connected and self.active_endpoint else []
        order += [e for e in self.endpoints if e not in order]
        last: BaseException | None = None
        for ep in order:
            ch = make_channel(ep, token=self.token, tls=self.tls, default_timeout=self.rpc_timeout)
            started = False
            try:
                stub = relay_pb2_grpc.RelayStub(ch)
                call = stub.FetchDeltas(
                    relay_pb2.FetchDeltasRequest(
                        from_version=from_version,
                        to_version=to_version,
                        subscriber_id=self.subscriber_id,
                        only_sequences=list(only_sequences),
                        follow=follow,
                    )
                )
                async for msg in call:
                    started = True
                    yield msg
                return
            except grpc.aio.AioRpcError as exc:
                last = exc
                if started or exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
            finally:
                await ch.close(grace=None)
        raise last or RuntimeError("no endpoint")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
