"""The weight subscriber (used by the actor service): stage ``D_v``, verify, commit at a safe point.

- Every version announced by the source is pulled over the striped transport into a
  :class:`~rollart.delta.DeltaStager` (each segment verified on arrival, duplicates dropped by sequence
  number) and finished (trailer, ``h(v)``, tensor structure) as soon as its last segment is in.
- ``Commit(v)`` (from the source's event stream, or :meth:`WeightSubscriber.commit` called by the actor's
  gRPC Commit) applies the chain ``D_{a+1} .. D_v`` from the active version ``a``: each delta must be
  complete, verified, based on the version active at that moment, and (for ``v``) carry the ordered
  ``h(v)``; then it is handed to the engine (``engine.apply_delta``), which applies it at a safe point
  (pause generation keeping requests, load, reset the prefix cache, resume). A rejected delta leaves
  the weights untouched.
- Missed versions are fetched from the source's cache (``FetchDeltas``): catching up costs K·|D|.
- A joiner loads the newest full checkpoint from the checkpoint store and replays the deltas after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from rollart.delta import Delta, DeltaStager, WeightSet, apply_delta
from rollart.delta import segment as sg
from rollart.delta.errors import BaseMismatchError, DeltaError
from rollart.runtime.config import TLSConfig
from rollart.v1 import common_pb2, relay_pb2

from . import transport as tp
from .follower import SourceFollower

log = logging.getLogger(__name__)


class CommitError(Exception):
    """A commit could not be applied; ``code`` is the gRPC status name (the weights are untouched)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


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


@dataclass
class Staged:
    """One version being staged (or staged) on this subscriber."""

    version: int
    stager: DeltaStager
    tracker: tp.SegmentTracker
    started_at: float = field(default_factory=time.time)
    completed_at: float | None = None
    delta: Delta | None = None
    error: str | None = None
    source: str = ""
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def proto(self) -> common_pb2.StagedWeights:
        msg = common_pb2.StagedWeights(
            version=self.version,
            base_version=self.tracker.base_version if self.tracker.base_version is not None else -1,
            hash=self.tracker.hash or b"",
            parts_received=self.tracker.received,
            parts_total=self.tracker.total or 0,
            bytes_received=self.tracker.bytes,
            complete=self.tracker.complete,
            verified=self.delta is not None,
            source=self.source,
            error=self.error or "",
        )
        msg.started_at.FromNanoseconds(int(self.started_at * 1e9))
        if self.completed_at is not None:
            msg.completed_at.FromNanoseconds(int(self.completed_at * 1e9))
        return msg


class _StagingSink:
    """SegmentSink into a Staged entry: the stager decodes and checks, the tracker counts and hashes."""

    def __init__(self, entry: Staged, owner: WeightSubscriber) -> None:
        self.entry = entry
        self.tracker = entry.tracker
        self.owner = owner

    async def put(self, seg: sg.Segment) -> bool:
        if self.tracker.has(seg.seq):
            self.tracker.duplicates += 1
            self.owner.duplicates += 1
            return False
        self.tracker.check(seg)
        self.entry.stager.add(seg.raw)  # verifies again and decodes the index stream (vectorised)
        self.tracker.add(seg)
        self.owner.segments_received += 1
        self.owner.bytes_received += len(seg.raw)
        if self.tracker.complete:
            self.owner._finish(self.entry)
        return True


@dataclass
class CommitResult:
    version: int
    applied: list[int]
    hash: bytes
    seconds: float
    from_checkpoint: int | None = None


class WeightSubscriber:
    """Stages deltas from a relay (with fallbacks) and applies them on Commit. See the module docstring."""

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
        kind: int = relay_pb2.RELAY_SUBSCRIBER_KIND_ACTOR,
    ) -> None:
        if engine is None:
            engine = LocalEngine(weights)
        self.engine = engine
        self.subscriber_id = subscriber_id
        self.job, self.key = job, bytes(key)
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
        self.active_version: int | None = version
        self.active_hash: bytes | None = weights.applied_hash if weights is not None else None
        self.staged: dict[int, Staged] = {}
        self.orders: dict[str, CommitResult] = {}
        self.errors: list[str] = []
        self.rejected: dict[int, str] = {}
        self.applied: list[tuple[int, bytes]] = []
        self.bytes_received = 0
        self.bytes_fetched = 0
        self.segments_received = 0
        self.duplicates = 0
        self.checkpoint_loads = 0
        self.updated = asyncio.Event()  # set after each applied commit (tests, status)
        self._lock = asyncio.Lock()
        self._staged_changed = asyncio.Event()
        self.follower = SourceFollower(
            subscriber_id=subscriber_id,
            kind=kind,
            job=job,
            key=self.key,
            token=token,
            endpoints=sources,
            sink_for=self._sink_for,
            state=self._state,
            on_commit=self._on_commit_event,
            streams=streams,
            region=region,
            tls=tls,
            reconnect_timeout=reconnect_timeout,
            idle_timeout=idle_timeout,
        )

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self, *, bootstrap: bool = True) -> None:
        """Load weights first when there are none (newest checkpoint + deltas), then follow the source."""
        if self.active_version is None and bootstrap and self.checkpoint_store is not None:
            await self.bootstrap()
        self.follower.start()

    async def stop(self) -> None:
        await self.follower.stop()

    @property
    def weights(self) -> WeightSet | None:
        return getattr(self.engine, "weights", None)

    def _state(self) -> tuple[bool, int, list[int]]:
        complete = sorted(v for v, e in self.staged.items() if e.delta is not None)
        return self.active_version is not None, self.active_version or 0, complete

    # ------------------------------------------------------------------------------------------- staging

    def entry(self, version: int) -> Staged | None:
        """The staging entry of a version newer than the active one (created on first use)."""
        if self.active_version is not None and version <= self.active_version:
            return None
        e = self.staged.get(version)
        if e is None:
            e = Staged(
                version, DeltaStager(self.key, job=self.job, version=version), tp.SegmentTracker(self.job, version)
            )
            self.staged[version] = e
        return e

    def _sink_for(self, version: int) -> _StagingSink | None:
        e = self.entry(version)
        if e is None or e.done.is_set():
            return None
        e.source = self.follower.active_endpoint
        return _StagingSink(e, self)

    def _finish(self, entry: Staged) -> None:
        try:
            entry.delta = entry.stager.finish()
            entry.stager = DeltaStager(self.key)  # the decoded delta is kept; drop the staging copies
        except DeltaError as exc:
            # Dropped so that a later pull or fetch stages it afresh; the reason stays for the commit's error.
            entry.error = f"{type(exc).__name__}: {exc}"
            self.rejected[entry.version] = entry.error
            self.errors.append(f"v{entry.version}: {entry.error}")
            log.warning("%s: staged v%d rejected: %s", self.subscriber_id, entry.version, entry.error)
            if self.staged.get(entry.version) is entry:
                del self.staged[entry.version]
        entry.completed_at = time.time()
        entry.done.set()
        self._staged_changed.set()

    async def _stage_message(self, msg: common_pb2.DeltaSegment) -> None:
        e = self.entry(msg.version)
        if e is None or e.done.is_set():
            return
        seg = sg.parse(msg.data, self.key)
        if (seg.job, seg.version, seg.seq) != (msg.job_id, msg.version, msg.sequence):
            raise DeltaError(f"FetchDeltas message fields disagree with segment {seg.seq}'s header")
        e.source = e.source or f"fetch:{self.follower.active_endpoint}"
        await _StagingSink(e, self).put(seg)

    async def fetch(self, from_version: int, to_version: int = 0) -> int:
        """Fetch D_{from+1} .. D_to from the source's cache into staging; returns bytes fetched."""
        n = 0
        only: list[int] = []
        first = self.staged.get(from_version + 1)
        if first is not None and first.tracker.received and not first.done.is_set():
            only = first.tracker.missing()  # only what the pull has not brought yet
            if first.tracker.segment_count is None:
                only = []  # without the trailer the total is unknown: ask for everything
        async for msg in self.follower.fetch(from_version, to_version, only):
            n += len(msg.data)
            await self._stage_message(msg)
        self.bytes_fetched += n
        return n

    # -------------------------------------------------------------------------------------------- commit

    async def _on_commit_event(self, order: common_pb2.CommitOrder) -> None:
        if order.actor_ids and self.subscriber_id not in order.actor_ids:
            return
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
        if self.active_version is None:
            if self.checkpoint_store is None:
                raise CommitError("FAILED_PRECONDITION", "no weights loaded and no checkpoint store to load them from")
            from_ckpt = await self._load_checkpoint(at_most=v)
        assert self.active_version is not None
        if self.active_version >= v:
            if self.active_version == v and order.hash and self.active_hash and order.hash != self.active_hash:
                raise CommitError(
                    "FAILED_PRECONDITION",
                    f"version {v} is active with h(v) {self.active_hash.hex()[:16]}…, "
                    f"the order names {order.hash.hex()[:16]}…",
                )
            return CommitResult(v, [], self.active_hash or b"", time.perf_counter() - t0, from_ckpt)
        # Resolve the whole chain first (every delta complete and verified), so that a commit that cannot
        # be completed changes nothing; then apply it in order.
        chain: list[Delta] = []
        cur = self.active_version
        fetched_from: int | None = None
        while cur < v:
            entry = await self._next(cur, v, deadline)
            if entry is None:
                if fetched_from == cur:
                    raise CommitError(
                        "FAILED_PRECONDITION",
                        self._why_missing(cur, v) or f"no delta based on version {cur} is available (up to v{v})",
                    )
                fetched_from = cur
                # Fetch only the gap: up to the first version already staged (pulled) beyond it.
                ahead = [e.version for e in self.staged.values() if e.delta is not None and cur < e.version <= v]
                upto = min(ahead) - 1 if ahead and min(ahead) - 1 > cur else v
                try:
                    await self.fetch(cur, upto)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.OUT_OF_RANGE and self.checkpoint_store is not None and not chain:
                        ck = await self._load_checkpoint(at_most=v)
                        if ck > cur:
                            from_ckpt = cur = ck
                            continue
                    why = self._why_missing(cur, v)
                    raise CommitError(
                        "FAILED_PRECONDITION" if why else exc.code().name,
                        why or f"cannot fetch the deltas after v{cur}: {exc.details()}",
                    ) from None
                continue
            assert entry.delta is not None and entry.delta.base_version == cur
            chain.append(entry.delta)
            cur = entry.delta.version
        if chain and chain[-1].version != v:
            raise CommitError("FAILED_PRECONDITION", f"the staged chain ends at v{chain[-1].version}, not v{v}")
        if chain and order.hash and chain[-1].hash != order.hash:
            raise CommitError(
                "FAILED_PRECONDITION",
                f"staged D_{v} hashes to {chain[-1].hash.hex()[:16]}…, the order names {order.hash.hex()[:16]}…",
            )
        applied: list[int] = []
        for delta in chain:
            try:
                await self.engine.apply_delta(delta)
            except BaseMismatchError as exc:
                raise CommitError("FAILED_PRECONDITION", str(exc)) from None
            self.active_version = delta.version
            self.active_hash = delta.hash
            self.applied.append((delta.version, delta.hash))
            applied.append(delta.version)
            for old in [k for k in self.staged if k <= delta.version]:
                del self.staged[old]
        self.updated.set()
        log.info("%s: committed v%d (applied %s)", self.subscriber_id, v, applied)
        return CommitResult(v, applied, self.active_hash or b"", time.perf_counter() - t0, from_ckpt)

    def _why_missing(self, cur: int, v: int) -> str:
        for e in sorted(self.staged.values(), key=lambda e: e.version):
            if e.version <= v and e.tracker.base_version is not None and e.tracker.base_version != cur:
                return (
                    f"the delta staged for version {e.version} is based on version {e.tracker.base_version}, "
                    f"but the active version is {cur}: it is not applied"
                )
        for ver in range(cur + 1, v + 1):
            if ver in self.rejected:
                return f"delta {ver} was rejected: {self.rejected[ver]}"
        return ""

    async def _next(self, cur: int, v: int, deadline: float) -> Staged | None:
        """The staged delta based on ``cur`` (waits while one is arriving); None when none is coming."""
        while True:
            mine = [e for e in self.staged.values() if e.version <= v]
            ready = [e for e in mine if e.delta is not None and e.delta.base_version == cur]
            if ready:
                return min(ready, key=lambda e: e.version)
            pulls = self.follower._pulls
            arriving = [
                e
                for e in mine
                if not e.done.is_set()
                and e.tracker.base_version in (cur, None)
                and (e.tracker.received > 0 or (e.version in pulls and not pulls[e.version].done()))
            ]
            if not arriving:
                return None
            if time.monotonic() >= deadline:
                raise CommitError(
                    "DEADLINE_EXCEEDED", f"delta {arriving[0].version} still incomplete at the commit deadline"
                )
            self._staged_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._staged_changed.wait(), min(0.25, max(0.01, deadline - time.monotonic())))

    # ------------------------------------------------------------------------------------------ joining

    async def _load_checkpoint(self, at_most: int | None = None) -> int:
        store = self.checkpoint_store
        info = await asyncio.to_thread(store.latest, at_most)
        if info is None:
            raise CommitError("FAILED_PRECONDITION", f"the checkpoint store holds no checkpoint <= {at_most}")
        weights = await asyncio.to_thread(store.open, info.version, writable=True)
        await self.engine.load_weights(weights, info.version)
        self.active_version = info.version
        self.active_hash = weights.applied_hash
        self.checkpoint_loads += 1
        self.bytes_fetched += info.size
        for old in [k for k in self.staged if k <= info.version]:
            del self.staged[old]
        log.info("%s: loaded checkpoint v%d (%d bytes)", self.subscriber_id, info.version, info.size)
        return info.version

    async def bootstrap(self, target: int = 0) -> CommitResult:
        """Join: the newest full checkpoint (<= target when given), then the deltas after it."""
        t0 = time.perf_counter()
        async with self._lock:
            ckpt = await self._load_checkpoint(at_most=target or None)
        result = CommitResult(ckpt, [], self.active_hash or b"", 0.0, ckpt)
        with contextlib.suppress(CommitError):
            result = await self.catch_up(target)
            result.from_checkpoint = ckpt
        result.seconds = time.perf_counter() - t0
        return result

    async def catch_up(self, target: int = 0) -> CommitResult:
        """Fetch and apply every delta after the active version up to ``target`` (0: the newest cached)."""
        assert self.active_version is not None
        cur = self.active_version
        if target == 0:
            await self.fetch(cur, 0)
            versions = [v for v, e in self.staged.items() if e.delta is not None]
            if not versions:
                return CommitResult(cur, [], self.active_hash or b"", 0.0)
            target = max(versions)
        order = common_pb2.CommitOrder(order_id=f"catch-up-{self.subscriber_id}-{target}", version=target)
        return await self.commit(order)

    # ------------------------------------------------------------------------------------------- status

    def status(self) -> common_pb2.ActorWeightState:
        return common_pb2.ActorWeightState(
            loaded=self.active_version is not None,
            active_version=self.active_version or 0,
            active_hash=self.active_hash or b"",
            staged=[self.staged[v].proto() for v in sorted(self.staged)],
        )

    async def wait_version(self, version: int, timeout: float = 30.0) -> None:
        """Until ``version`` is active (tests and tools)."""
        deadline = time.monotonic() + timeout
        while self.active_version is None or self.active_version < version:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.subscriber_id}: v{version} not active after {timeout}s")
            self.updated.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.updated.wait(), 0.1)

    async def wait_staged(self, version: int, timeout: float = 30.0) -> Staged:
        deadline = time.monotonic() + timeout
        while True:
            e = self.staged.get(version)
            if e is not None and e.done.is_set():
                return e
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.subscriber_id}: v{version} not staged after {timeout}s")
            self._staged_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._staged_changed.wait(), 0.1)
