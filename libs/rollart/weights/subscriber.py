"""The weight subscriber: receive ``D_v`` from a relay into staging (:class:`DeltaSource`), and commit it
(:class:`WeightSubscriber`, the standalone owner for tests, benchmarks and engine-less actors).

Invariants: :class:`DeltaSource` keeps no version state of its own (the active version is its owner's, staged
versions live in the :class:`~rollart.weights.staging.VersionStaging` it was given); a :class:`WeightSubscriber`
commit checks every base version and ``h(v)`` of the whole route before its engine sees anything, so a commit that
cannot complete changes nothing. docs/weight-plane.md ("Subscriber (actors) and publisher (trainer)").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from rollart.delta import Delta, WeightSet, apply_delta
from rollart.delta.errors import BaseMismatchError
from rollart.runtime import errors
from rollart.runtime.config import TLSConfig
from rollart.v1 import common_pb2, relay_pb2

from .follower import SourceFollower
from .staging import ARRIVING, StagedVersion, StagingError, StagingSink, VersionStaging

log = logging.getLogger(__name__)


class CommitError(errors.Coded):
    """A commit could not be applied; ``code`` is the gRPC status name (the weights are untouched)."""

    code: str  # a status name, as every caller passes


class WeightEngine(Protocol):
    """What receives verified weights. The actor's engine pauses, loads, resets its prefix cache, resumes."""

    async def apply_delta(self, delta: Delta) -> None: ...

    async def load_weights(self, weights: WeightSet, version: int) -> None: ...


class LocalEngine:
    """Weights held in this process as numpy arrays (tests, benchmarks, relays of full weights)."""

    def __init__(self, weights: WeightSet | None = None) -> None:
        self.weights = weights

    async def apply_delta(self, delta: Delta) -> None:
        assert self.weights is not None
        await asyncio.to_thread(apply_delta, delta, self.weights)

    async def load_weights(self, weights: WeightSet, version: int) -> None:
        weights.version = version
        self.weights = weights


# ------------------------------------------------------------------------------------------------ source


class DeltaSource:
    """Delivers a job's deltas from relay-like sources into a :class:`VersionStaging`. See the module docstring.

    ``active()`` returns the owner's active version (None: no weights yet); ``on_commit`` receives the
    source's commit orders meant for this subscriber.
    """

    def __init__(
        self,
        *,
        subscriber_id: str,
        job: str,
        key: bytes,
        token: str | None,
        sources: Sequence[str],
        staging: VersionStaging,
        active: Callable[[], int | None],
        on_commit: Callable[[common_pb2.CommitOrder], Awaitable[Any]] | None = None,
        streams: int = 4,
        region: str = "",
        tls: TLSConfig | None = None,
        reconnect_timeout: float = 3.0,
        idle_timeout: float = 30.0,
        kind: relay_pb2.RelaySubscriberKind = relay_pb2.RELAY_SUBSCRIBER_KIND_ACTOR,
    ) -> None:
        self.subscriber_id = subscriber_id
        self.staging = staging
        self.active = active
        self.on_commit = on_commit
        self.bytes_fetched = 0
        self.follower = SourceFollower(
            subscriber_id=subscriber_id,
            kind=kind,
            job=job,
            key=bytes(key),
            token=token,
            endpoints=sources,
            sink_for=self._sink_for,
            state=self._state,
            on_commit=self._commit_event if on_commit is not None else None,
            streams=streams,
            region=region,
            tls=tls,
            reconnect_timeout=reconnect_timeout,
            idle_timeout=idle_timeout,
        )

    def start(self) -> None:
        self.follower.start()

    async def stop(self) -> None:
        await self.follower.stop()

    @property
    def active_endpoint(self) -> str:
        return self.follower.active_endpoint

    @property
    def connected(self) -> bool:
        return self.follower.connected

    def _state(self) -> tuple[bool, int, list[int]]:
        active = self.active()
        return active is not None, active or 0, self.staging.staged_deltas()

    def _sink_for(self, version: int) -> StagingSink | None:
        return self.staging.sink(version, self.active(), self.follower.active_endpoint)

    async def _commit_event(self, order: common_pb2.CommitOrder) -> None:
        if order.actor_ids and self.subscriber_id not in order.actor_ids:
            return
        assert self.on_commit is not None
        await self.on_commit(order)

    async def fetch(self, from_version: int, to_version: int = 0) -> int:
        """Fetch D_{from+1} .. D_to from the source's cache into staging; returns bytes fetched.

        Raises grpc.aio.AioRpcError from the source, StagingError for a segment that does not stage.
        """
        n = 0
        only: list[int] = []
        first = self.staging.entries.get(from_version + 1)
        if first is not None and first.received and first.state == ARRIVING and first.tracker is not None:
            only = first.tracker.missing()  # only what the pull has not brought yet
            if first.tracker.segment_count is None:
                only = []  # without the trailer the total is unknown: ask for everything
        source = f"fetch:{self.follower.active_endpoint}"
        async for msg in self.follower.fetch(from_version, to_version, only):
            n += len(msg.data)
            self.staging.stage_message(msg, self.active(), source=source, pushed=False)
        self.bytes_fetched += n
        return n

    async def gather(self, active: int, target: int, deadline: float) -> None:
        """Bring the whole route ``active -> target`` into staging (waiting, then fetching, each gap once).

        Raises StagingError: FAILED_PRECONDITION (a link is missing, based on another version or
        rejected), DEADLINE_EXCEEDED (still arriving at ``deadline``), or the fetch's status; ``at`` is the
        version the route stops at and ``out_of_range`` says the source's cache no longer reaches it.
        """
        st = self.staging
        full = st.newest_full(active, target)
        cur = full.version if full is not None else active
        fetched_from: int | None = None
        while cur < target:
            nxt = st.next_delta(cur, target)
            if nxt is not None:
                cur = nxt.version
                continue
            arriving = st.arriving(cur, target, self.follower.pulling)
            if arriving:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StagingError(
                        "DEADLINE_EXCEEDED",
                        f"delta {arriving[0].version} still incomplete at the commit deadline",
                        at=cur,
                    )
                await st.wait_changed(min(0.25, max(0.01, left)))
                continue
            if fetched_from == cur:
                raise StagingError("FAILED_PRECONDITION", st.why_missing(cur, target), at=cur)
            fetched_from = cur
            # Fetch only the gap: up to the first version already staged (pulled) beyond it.
            ahead = [v for v in st.staged_deltas() if cur < v <= target]
            upto = min(ahead) - 1 if ahead and min(ahead) - 1 > cur else target
            try:
                await self.fetch(cur, upto)
            except grpc.aio.AioRpcError as exc:
                why = st.reason(cur, target)
                raise StagingError(
                    "FAILED_PRECONDITION" if why else exc.code().name,
                    why or f"cannot fetch the deltas after v{cur}: {exc.details()}",
                    at=cur,
                    out_of_range=exc.code() == grpc.StatusCode.OUT_OF_RANGE,
                ) from None


# ------------------------------------------------------------------------------------------- subscriber


@dataclass
class CommitResult:
    version: int
    applied: list[int]
    hash: bytes
    seconds: float
    from_checkpoint: int | None = None


class WeightSubscriber:
    """A standalone owner of weights that follows a relay and commits. See the module docstring."""

    def __init__(
        self,
        *,
        subscriber_id: str,
        job: str,
        key: bytes,
        token: str | None,
        sources: Sequence[str],
        engine: WeightEngine | None = None,
        weights: WeightSet | None = None,
        version: int | None = None,
        checkpoint_store: Any = None,
        streams: int = 4,
        region: str = "",
        tls: TLSConfig | None = None,
        commit_timeout: float = 60.0,
        reconnect_timeout: float = 3.0,
        idle_timeout: float = 30.0,
        kind: relay_pb2.RelaySubscriberKind = relay_pb2.RELAY_SUBSCRIBER_KIND_ACTOR,
    ) -> None:
        if engine is None:
            engine = LocalEngine(weights)
        self.engine = engine
        self.subscriber_id = subscriber_id
        if isinstance(checkpoint_store, str | os.PathLike):
            from .checkpoint_store import open_store

            checkpoint_store = open_store(checkpoint_store)
        self.checkpoint_store = checkpoint_store  # a checkpoint_store.CheckpointStore (latest, open)
        self.commit_timeout = commit_timeout
        if weights is not None:
            if version is None:
                version = weights.version
            elif weights.version is None:
                weights.version = version  # e.g. a checkpoint written without rollart metadata
        # The active version and h(v): written only where this subscriber applies weights.
        self._active_version: int | None = version
        self._active_hash: bytes | None = weights.applied_hash if weights is not None else None
        self.staging = VersionStaging(key=key, job=job)
        self.orders: dict[str, CommitResult] = {}
        self.errors: list[str] = []
        self.applied: list[tuple[int, bytes]] = []
        self.checkpoint_loads = 0
        self.checkpoint_bytes = 0
        self.updated = asyncio.Event()  # set after each applied commit (tests, status)
        self._lock = asyncio.Lock()
        self.source = DeltaSource(
            subscriber_id=subscriber_id,
            job=job,
            key=key,
            token=token,
            sources=sources,
            staging=self.staging,
            active=lambda: self._active_version,
            on_commit=self._on_commit_event,
            streams=streams,
            region=region,
            tls=tls,
            reconnect_timeout=reconnect_timeout,
            idle_timeout=idle_timeout,
            kind=kind,
        )

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self, *, bootstrap: bool = True) -> None:
        """Load weights first when there are none (newest checkpoint + deltas), then follow the source."""
        if self._active_version is None and bootstrap and self.checkpoint_store is not None:
            await self.bootstrap()
        self.source.start()

    async def stop(self) -> None:
        await self.source.stop()

    # ------------------------------------------------------------------------------------------- reading

    @property
    def follower(self) -> SourceFollower:
        return self.source.follower

    @property
    def active_version(self) -> int | None:
        return self._active_version

    @property
    def active_hash(self) -> bytes | None:
        return self._active_hash

    @property
    def weights(self) -> WeightSet | None:
        return getattr(self.engine, "weights", None)

    @property
    def staged(self) -> dict[int, StagedVersion]:
        return self.staging.entries

    @property
    def segments_received(self) -> int:
        return self.staging.segments_received

    @property
    def bytes_received(self) -> int:
        return self.staging.bytes_received

    @property
    def duplicates(self) -> int:
        return self.staging.duplicates

    @property
    def bytes_fetched(self) -> int:
        return self.source.bytes_fetched + self.checkpoint_bytes

    async def fetch(self, from_version: int, to_version: int = 0) -> int:
        """Fetch D_{from+1} .. D_to from the source's cache into staging; returns bytes fetched."""
        return await self.source.fetch(from_version, to_version)

    # -------------------------------------------------------------------------------------------- commit

    async def _on_commit_event(self, order: common_pb2.CommitOrder) -> None:
        try:
            await self.commit(order)
        except CommitError as exc:
            self.errors.append(f"commit {order.order_id} (v{order.version}): {exc}")
            raise

    async def commit(self, order: common_pb2.CommitOrder, timeout: float | None = None) -> CommitResult:
        """Make ``order.version`` active: apply the staged chain (fetching what is missing)."""
        async with self._lock:
            if order.order_id and order.order_id in self.orders:
                return self.orders[order.order_id]
            result = await self._commit(order, timeout or self.commit_timeout)
            if order.order_id:
                self.orders[order.order_id] = result
            return result

    async def _commit(self, order: common_pb2.CommitOrder, timeout: float) -> CommitResult:
        t0 = time.perf_counter()
        v = order.version
        deadline = time.monotonic() + timeout
        from_ckpt = None
        if self._active_version is None:
            if self.checkpoint_store is None:
                raise CommitError("FAILED_PRECONDITION", "no weights loaded and no checkpoint store to load them from")
            from_ckpt = await self._load_checkpoint(at_most=v)
        active = self._active_version
        assert active is not None
        if active >= v:
            if active == v and order.hash and self._active_hash and order.hash != self._active_hash:
                raise CommitError(
                    "FAILED_PRECONDITION",
                    f"version {v} is active with h(v) {self._active_hash.hex()[:16]}…, "
                    f"the order names {order.hash.hex()[:16]}…",
                )
            return CommitResult(v, [], self._active_hash or b"", time.perf_counter() - t0, from_ckpt)
        # Gather the whole route first (every delta complete and verified), so that a commit that cannot be
        # completed changes nothing; then apply it in order.
        try:
            await self.source.gather(active, v, deadline)
        except StagingError as exc:
            if not (exc.out_of_range and exc.at == active and self.checkpoint_store is not None):
                raise CommitError(exc.code, str(exc)) from None
            ck = await self._load_checkpoint(at_most=v)
            if ck <= active:
                raise CommitError(exc.code, str(exc)) from None
            from_ckpt = active = ck
            try:
                await self.source.gather(active, v, deadline)
            except StagingError as again:
                raise CommitError(again.code, str(again)) from None
        try:
            route = self.staging.route(active, v)
        except StagingError as exc:
            raise CommitError(exc.code, str(exc)) from None
        if route.deltas and order.hash and route.hash != order.hash:
            raise CommitError(
                "FAILED_PRECONDITION",
                f"staged D_{v} hashes to {route.hash.hex()[:16]}…, the order names {order.hash.hex()[:16]}…",
            )
        # Format-2 deltas name the weights they apply to (h(v-1)): check the whole chain before applying any.
        have = self._active_hash
        for delta in route.deltas:
            if delta.base_hash is not None and have is not None and delta.base_hash != have:
                raise CommitError(
                    "FAILED_PRECONDITION",
                    f"BaseMismatchError: D_{delta.version} is based on weights {delta.base_hash.hex()[:16]}…, "
                    f"the active v{delta.base_version} is {have.hex()[:16]}…",
                )
            have = delta.hash
        applied: list[int] = []
        for delta in route.deltas:
            try:
                await self.engine.apply_delta(delta)
            except BaseMismatchError as exc:
                raise CommitError("FAILED_PRECONDITION", str(exc)) from None
            self._active_version, self._active_hash = delta.version, delta.hash
            self.applied.append((delta.version, delta.hash))
            applied.append(delta.version)
            self.staging.prune(delta.version)
        self.updated.set()
        log.info("%s: committed v%d (applied %s)", self.subscriber_id, v, applied)
        return CommitResult(v, applied, self._active_hash or b"", time.perf_counter() - t0, from_ckpt)

    # ------------------------------------------------------------------------------------------ joining

    async def _load_checkpoint(self, at_most: int | None = None) -> int:
        store = self.checkpoint_store
        info = await asyncio.to_thread(store.latest, at_most)
        if info is None:
            raise CommitError("FAILED_PRECONDITION", f"the checkpoint store holds no checkpoint <= {at_most}")
        weights = await asyncio.to_thread(store.open, info.version, writable=True)
        await self.engine.load_weights(weights, info.version)
        self._active_version, self._active_hash = info.version, weights.applied_hash
        self.checkpoint_loads += 1
        self.checkpoint_bytes += info.size
        self.staging.prune(info.version)
        log.info("%s: loaded checkpoint v%d (%d bytes)", self.subscriber_id, info.version, info.size)
        return info.version

    async def bootstrap(self, target: int = 0) -> CommitResult:
        """Join: the newest full checkpoint (<= target when given), then the deltas after it."""
        t0 = time.perf_counter()
        async with self._lock:
            ckpt = await self._load_checkpoint(at_most=target or None)
        result = CommitResult(ckpt, [], self._active_hash or b"", 0.0, ckpt)
        with contextlib.suppress(CommitError):
            result = await self.catch_up(target)
            result.from_checkpoint = ckpt
        result.seconds = time.perf_counter() - t0
        return result

    async def catch_up(self, target: int = 0) -> CommitResult:
        """Fetch and apply every delta after the active version up to ``target`` (0: the newest cached)."""
        assert self._active_version is not None
        cur = self._active_version
        if target == 0:
            await self.source.fetch(cur, 0)
            versions = self.staging.staged_deltas()
            if not versions:
                return CommitResult(cur, [], self._active_hash or b"", 0.0)
            target = max(versions)
        order = common_pb2.CommitOrder(order_id=f"catch-up-{self.subscriber_id}-{target}", version=target)
        return await self.commit(order)

    # ------------------------------------------------------------------------------------------- status

    def status(self) -> common_pb2.ActorWeightState:
        return common_pb2.ActorWeightState(
            loaded=self._active_version is not None,
            active_version=self._active_version or 0,
            active_hash=self._active_hash or b"",
            staged=self.staging.staged(),
        )

    async def wait_version(self, version: int, timeout: float = 30.0) -> None:
        """Until ``version`` is active (tests and tools)."""
        deadline = time.monotonic() + timeout
        while self._active_version is None or self._active_version < version:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.subscriber_id}: v{version} not active after {timeout}s")
            self.updated.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.updated.wait(), 0.1)

    async def wait_staged(self, version: int, timeout: float = 30.0) -> StagedVersion:
        """Until ``version`` is STAGED or REJECTED (tests and tools)."""
        deadline = time.monotonic() + timeout
        while True:
            e = self.staging.entries.get(version)
            if e is not None and e.state != ARRIVING:
                return e
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.subscriber_id}: v{version} not staged after {timeout}s")
            await self.staging.wait_changed(0.1)
