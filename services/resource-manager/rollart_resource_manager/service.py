"""The ResourceManager gRPC service over Redis.

Redis keys (under ``key_prefix``): ``pools``, ``workers``, ``bindings`` (hashes of serialized protobufs), ``expiry``
(sorted set worker -> expiry time), ``revision`` (last event revision) and ``events`` (a stream whose entry ids are
``<revision>-1``). Every change is one MULTI/EXEC transaction that writes the new state and its event together, so
a watcher never sees an event whose state was not stored, and a restarted resource manager serves the same state.
Mutations are serialized by one lock in this process (the resource manager is the single writer of its keys).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import cast

import redis.asyncio as aioredis
import redis.exceptions
from grpc import aio

from rollart.runtime import errors, ids
from rollart.runtime.background import Periodic
from rollart.runtime.server import StartupError
from rollart.runtime.telemetry import log_fields
from rollart.runtime.timeutil import seconds as _secs
from rollart.runtime.timeutil import timestamp as _ts
from rollart.v1 import common_pb2
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

from . import validators
from .config import ResourceManagerConfig
from .placement import PlacementError, place

log = logging.getLogger(__name__)
ET = rm.ResourceEventType


def redacted_url(url: str) -> str:
    """``url`` with its password (``redis://:secret@host``) replaced by ``***``, for log lines."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not sep or not at:
        return url
    user, colon, _ = creds.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{host}"
# redis-py types every reply as bytes | str; this client never decodes, so its replies are bytes (casts below).
_Entries = list[tuple[bytes, dict[bytes, bytes]]]


class ResourceManagerService(rm_grpc.ResourceManagerServicer):
    name = "resource-manager"
    service_names = [rm.DESCRIPTOR.services_by_name["ResourceManager"].full_name]

    def __init__(self, cfg: ResourceManagerConfig) -> None:
        self.cfg = cfg
        self.redis = aioredis.from_url(cfg.redis_url)
        p = cfg.key_prefix
        self.k_pools, self.k_workers, self.k_bindings = p + "pools", p + "workers", p + "bindings"
        self.k_expiry, self.k_revision, self.k_events = p + "expiry", p + "revision", p + "events"
        self.lock = asyncio.Lock()
        self._reaper = Periodic(self.reap, cfg.reap_interval_seconds, name="rm-reaper")

    # --------------------------------------------------------------------------------------------- lifecycle

    def add_to_server(self, server: aio.Server) -> None:
        rm_grpc.add_ResourceManagerServicer_to_server(self, server)

    async def start(self) -> None:
        try:
            await self.redis.ping()
        except (redis.exceptions.RedisError, OSError) as exc:
            # One line naming the setting (the URL without its password), not a traceback per restart.
            raise StartupError(
                f"cannot reach Redis at {redacted_url(self.cfg.redis_url)} (redis_url / ROLLART_REDIS_URL): {exc}"
            ) from None
        self._reaper.start()

    async def stop(self) -> None:
        await self._reaper.stop()
        await self.redis.aclose()

    # ------------------------------------------------------------------------------------------------- state

    async def _load(self) -> tuple[dict[str, rm.Pool], dict[str, rm.Worker], dict[str, rm.Binding]]:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(self.k_pools)
        pipe.hgetall(self.k_workers)
        pipe.hgetall(self.k_bindings)
        raw_pools, raw_workers, raw_bindings = await pipe.execute()
        pools = {k.decode(): rm.Pool.FromString(v) for k, v in raw_pools.items()}
        workers = {k.decode(): rm.Worker.FromString(v) for k, v in raw_workers.items()}
        bindings = {k.decode(): rm.Binding.FromString(v) for k, v in raw_bindings.items()}
        now = time.time()
        for w in workers.values():
            # Expiry is judged on read too, so a worker past its TTL is never bound even before the reaper runs.
            if w.state == rm.WORKER_STATE_ALIVE and w.ttl_seconds > 0:
                if _secs(w.last_heartbeat) + w.ttl_seconds < now:
                    w.state = rm.WORKER_STATE_EXPIRED
        return pools, workers, bindings

    async def _commit(
        self,
        *,
        pools: dict[str, rm.Pool | None] | None = None,
        workers: dict[str, rm.Worker | None] | None = None,
        bindings: dict[str, rm.Binding | None] | None = None,
        expiry: dict[str, float | None] | None = None,
        events: Sequence[tuple[rm.ResourceEventType, object]] = (),
    ) -> None:
        """Write state changes (None deletes) and their events in one transaction."""
        revision = int(await self.redis.get(self.k_revision) or 0)
        pipe = self.redis.pipeline(transaction=True)
        for key, items in ((self.k_pools, pools), (self.k_workers, workers), (self.k_bindings, bindings)):
            for name, value in (items or {}).items():
                if value is None:
                    pipe.hdel(key, name)
                else:
                    pipe.hset(key, name, value.SerializeToString())
        for wid, at in (expiry or {}).items():
            if at is None:
                pipe.zrem(self.k_expiry, wid)
            else:
                pipe.zadd(self.k_expiry, {wid: at})
        now = time.time()
        for etype, subject in events:
            revision += 1
            ev = rm.ResourceEvent(revision=revision, type=etype, at=_ts(now))
            getattr(ev, {rm.Pool: "pool", rm.Worker: "worker", rm.Binding: "binding"}[type(subject)]).CopyFrom(subject)
            pipe.xadd(
                self.k_events,
                {"e": ev.SerializeToString()},
                id=f"{revision}-1",
                maxlen=self.cfg.event_history,
                approximate=True,
            )
        if events:
            pipe.set(self.k_revision, revision)
        await pipe.execute()

    @staticmethod
    def _derive(pools: dict[str, rm.Pool], workers: dict[str, rm.Worker], bindings: dict[str, rm.Binding]) -> None:
        """Fill the derived fields (live workers, bound slots, a worker's bindings) for answers."""
        for p in pools.values():
            p.live_workers = 0
            p.bound_slots = 0
        for w in workers.values():
            del w.binding_ids[:]
            if w.state == rm.WORKER_STATE_ALIVE and w.pool in pools:
                pools[w.pool].live_workers += 1
        for b in bindings.values():
            slots = max(b.request.slots_per_replica, 1)
            for m in b.workers:
                if m.pool in pools:
                    pools[m.pool].bound_slots += slots
                if m.worker_id in workers:
                    workers[m.worker_id].binding_ids.append(b.binding_id)

    def _replace(
        self,
        pools: dict[str, rm.Pool],
        workers: dict[str, rm.Worker],
        bindings: dict[str, rm.Binding],
        only: set[str] | None = None,
    ) -> dict[str, rm.Binding]:
        """Re-place bindings that lost workers or are short of replicas; returns the changed ones."""
        alive = {w.worker_id: w for w in workers.values() if w.state == rm.WORKER_STATE_ALIVE}
        changed: dict[str, rm.Binding] = {}
        for bid in sorted(bindings):
            b = bindings[bid]
            if only is not None and bid not in only:
                lost = any(m.worker_id not in alive for m in b.workers)
                if not lost and not b.degraded:
                    continue
            busy, used = self._others(bindings, bid)
            try:
                pl = place(b.request, pools, alive, busy, used, current=b)
                new_workers, fallback, degraded, reason = pl.workers, pl.fallback, pl.degraded, pl.reason
            except PlacementError as exc:
                new_workers, fallback, degraded, reason = [], False, True, str(exc)
            if [m.worker_id for m in new_workers] == [m.worker_id for m in b.workers] and degraded == b.degraded:
                continue
            nb = rm.Binding()
            nb.CopyFrom(b)
            del nb.workers[:]
            nb.workers.extend(new_workers)
            nb.fallback, nb.degraded, nb.reason = fallback, degraded, reason
            nb.updated_at.CopyFrom(_ts(time.time()))
            bindings[bid] = nb
            changed[bid] = nb
        return changed

    @staticmethod
    def _others(bindings: dict[str, rm.Binding], exclude: str) -> tuple[set[str], dict[str, int]]:
        busy: set[str] = set()
        used: dict[str, int] = {}
        for bid, b in bindings.items():
            if bid == exclude:
                continue
            slots = max(b.request.slots_per_replica, 1)
            for m in b.workers:
                busy.add(m.worker_id)
                used[m.pool] = used.get(m.pool, 0) + slots
        return busy, used

    # ---------------------------------------------------------------------------------------------- reaper

    async def reap(self) -> None:
        now = time.time()
        due = cast(list[bytes], await self.redis.zrangebyscore(self.k_expiry, "-inf", now))
        purge_before = now - self.cfg.expired_retention_seconds
        async with self.lock:
            pools, workers, bindings = await self._load()
            expired: dict[str, rm.Worker | None] = {}
            events: list[tuple[rm.ResourceEventType, object]] = []
            for raw in due:
                wid = raw.decode()
                w = workers.get(wid)
                if w is None:
                    continue
                if _secs(w.last_heartbeat) + w.ttl_seconds >= now:
                    continue  # renewed since the read above
                w.state = rm.WORKER_STATE_EXPIRED
                expired[wid] = w
                events.append((ET.RESOURCE_EVENT_TYPE_WORKER_EXPIRED, w))
                log.info("worker expired", extra=log_fields(worker_id=wid, pool=w.pool))
            purged = {
                wid: None
                for wid, w in workers.items()
                if w.state == rm.WORKER_STATE_EXPIRED and _secs(w.last_heartbeat) < purge_before
            }
            for wid in purged:
                workers.pop(wid, None)
            changed = self._replace(pools, workers, bindings, only=set())
            events.extend((ET.RESOURCE_EVENT_TYPE_BINDING_UPDATED, b) for b in changed.values())
            if expired or purged or changed:
                await self._commit(
                    workers={**expired, **purged},
                    bindings=dict(changed),
                    expiry={wid: None for wid in list(expired) + list(purged)},
                    events=events,
                )

    # ----------------------------------------------------------------------------------------------- pools

    async def RegisterPool(self, request: rm.RegisterPoolRequest, context: aio.ServicerContext) -> rm.Pool:
        pool = rm.Pool()
        pool.CopyFrom(request.pool)
        validators.pool(pool)
        async with self.lock:
            pools, workers, bindings = await self._load()
            existing = pools.get(pool.name)
            # A new pool is up; re-registering keeps a manual down state unless the caller sets up=true.
            pool.up = True if existing is None else (existing.up or pool.up)
            pools[pool.name] = pool
            changed = self._replace(pools, workers, bindings, only=set())
            await self._commit(
                pools={pool.name: pool},
                bindings=dict(changed),
                events=[(ET.RESOURCE_EVENT_TYPE_POOL_UPSERTED, pool)]
                + [(ET.RESOURCE_EVENT_TYPE_BINDING_UPDATED, b) for b in changed.values()],
            )
            self._derive(pools, workers, bindings)
            return pools[pool.name]

    async def SetPoolState(self, request: rm.SetPoolStateRequest, context: aio.ServicerContext) -> rm.Pool:
        async with self.lock:
            pools, workers, bindings = await self._load()
            pool = pools.get(request.name)
            if pool is None:
                raise errors.NotFound(f"no pool named {errors.shorten(request.name)}")
            pool.up = request.up
            # Bindings on a pool that went down move to compatible pools.
            if not request.up:
                for b in bindings.values():
                    kept = [m for m in b.workers if m.pool != pool.name]
                    if len(kept) != len(b.workers):
                        del b.workers[:]
                        b.workers.extend(kept)
                        b.degraded = True
            changed = self._replace(pools, workers, bindings, only=set())
            await self._commit(
                pools={pool.name: pool},
                bindings=dict(changed),
                events=[(ET.RESOURCE_EVENT_TYPE_POOL_UPSERTED, pool)]
                + [(ET.RESOURCE_EVENT_TYPE_BINDING_UPDATED, b) for b in changed.values()],
            )
            self._derive(pools, workers, bindings)
            return pools[pool.name]

    async def RemovePool(self, request: rm.RemovePoolRequest, context: aio.ServicerContext) -> common_pb2.Nothing:
        async with self.lock:
            pools, workers, bindings = await self._load()
            pool = pools.pop(request.name, None)
            if pool is None:
                raise errors.NotFound(f"no pool named {errors.shorten(request.name)}")
            gone: dict[str, rm.Worker | None] = {wid: None for wid, w in workers.items() if w.pool == request.name}
            for wid in gone:
                workers.pop(wid)
            changed = self._replace(pools, workers, bindings, only=set())
            events: list[tuple[rm.ResourceEventType, object]] = [(ET.RESOURCE_EVENT_TYPE_POOL_REMOVED, pool)]
            events += [(ET.RESOURCE_EVENT_TYPE_BINDING_UPDATED, b) for b in changed.values()]
            await self._commit(
                pools={request.name: None},
                workers=gone,
                bindings=dict(changed),
                expiry={wid: None for wid in gone},
                events=events,
            )
            return common_pb2.Nothing()

    async def ListPools(self, request: rm.ListPoolsRequest, context: aio.ServicerContext) -> rm.ListPoolsResponse:
        pools, workers, bindings = await self._load()
        self._derive(pools, workers, bindings)
        return rm.ListPoolsResponse(pools=[pools[n] for n in sorted(pools)])

    # --------------------------------------------------------------------------------------------- workers

    async def RegisterWorker(
        self, request: rm.RegisterWorkerRequest, context: aio.ServicerContext
    ) -> rm.RegisterWorkerResponse:
        w = rm.Worker()
        w.CopyFrom(request.worker)
        validators.worker(w)
        async with self.lock:
            pools, workers, bindings = await self._load()
            pool = pools.get(w.pool)
            if pool is None:
                raise errors.FailedPrecondition(
                    f"worker.pool {errors.shorten(w.pool)} does not exist; register it first"
                )
            validators.worker_kind(w, pool)
            if w.ttl_seconds == 0:
                if pool.kind != common_pb2.POOL_KIND_SERVERLESS:
                    w.ttl_seconds = self.cfg.default_ttl_seconds
            now = time.time()
            old = workers.get(w.worker_id)
            w.region = w.region or pool.region
            w.state = rm.WORKER_STATE_ALIVE
            w.registered_at.CopyFrom(old.registered_at if old is not None else _ts(now))
            w.last_heartbeat.CopyFrom(_ts(now))
            del w.binding_ids[:]
            workers[w.worker_id] = w
            changed = self._replace(pools, workers, bindings, only=set())
            await self._commit(
                workers={w.worker_id: w},
                bindings=dict(changed),
                expiry={w.worker_id: now + w.ttl_seconds if w.ttl_seconds > 0 else None},
                events=[(ET.RESOURCE_EVENT_TYPE_WORKER_REGISTERED, w)]
                + [(ET.RESOURCE_EVENT_TYPE_BINDING_UPDATED, b) for b in changed.values()],
            )
            log.info("worker registered", extra=log_fields(worker_id=w.worker_id, role=w.role, pool=w.pool))
            self._derive(pools, workers, bindings)
            return rm.RegisterWorkerResponse(
                worker=workers[w.worker_id], heartbeat_interval_seconds=max(w.ttl_seconds / 3, 0.05)
            )

    async def Heartbeat(self, request: rm.HeartbeatRequest, context: aio.ServicerContext) -> rm.HeartbeatResponse:
        ids.check_id("worker_id", request.worker_id)
        validators.load(request.load)
        # Heartbeats are the hottest call: no lock, only the worker's own record and expiry change.
        raw = cast(bytes | None, await self.redis.hget(self.k_workers, request.worker_id))
        now = time.time()
        w = rm.Worker.FromString(raw) if raw else None
        if (
            w is None
            or w.state != rm.WORKER_STATE_ALIVE
            or (w.ttl_seconds > 0 and _secs(w.last_heartbeat) + w.ttl_seconds < now)
        ):
            raise errors.NotFound(
                f"worker {errors.shorten(request.worker_id)} is not registered or expired; register again"
            )
        async with self.lock:
            raw = cast(bytes | None, await self.redis.hget(self.k_workers, request.worker_id))
            if raw is None:
                raise errors.NotFound(f"worker {errors.shorten(request.worker_id)} was removed")
            w = rm.Worker.FromString(raw)
            w.last_heartbeat.CopyFrom(_ts(now))
            for k, v in request.load.items():
                w.labels[f"load.{k}"] = f"{v:g}"
            await self._commit(
                workers={w.worker_id: w}, expiry={w.worker_id: now + w.ttl_seconds if w.ttl_seconds > 0 else None}
            )
        return rm.HeartbeatResponse(expires_at=_ts(now + w.ttl_seconds) if w.ttl_seconds > 0 else None)

    async def DeregisterWorker(
        self, request: rm.DeregisterWorkerRequest, context: aio.ServicerContext
    ) -> common_pb2.Nothing:
        async with self.lock:
            pools, workers, bindings = await self._load()
            w = workers.pop(request.worker_id, None)
            if w is None:
                return common_pb2.Nothing()  # idempotent: already gone
            changed = self._replace(pools, workers, bindings, only=set())
            await self._commit(
                workers={request.worker_id: None},
                bindings=dict(changed),
                expiry={request.worker_id: None},
                events=[(ET.RESOURCE_EVENT_TYPE_WORKER_DEREGISTERED, w)]
                + [(ET.RESOURCE_EVENT_TYPE_BINDING_UPDATED, b) for b in changed.values()],
            )
            return common_pb2.Nothing()

    async def ListWorkers(self, request: rm.ListWorkersRequest, context: aio.ServicerContext) -> rm.ListWorkersResponse:
        pools, workers, bindings = await self._load()
        self._derive(pools, workers, bindings)
        out = [
            w
            for _, w in sorted(workers.items())
            if (not request.role or w.role == request.role)
            and (not request.pool or w.pool == request.pool)
            and (request.include_expired or w.state == rm.WORKER_STATE_ALIVE)
        ]
        return rm.ListWorkersResponse(workers=out)

    # -------------------------------------------------------------------------------------------- bindings

    async def Bind(self, request: rm.BindRequest, context: aio.ServicerContext) -> rm.Binding:
        req = rm.BindRequest()
        req.CopyFrom(request)
        validators.bind(req)
        async with self.lock:
            pools, workers, bindings = await self._load()
            if req.preferred_pool and req.preferred_pool not in pools:
                raise errors.FailedPrecondition(f"no pool named {errors.shorten(req.preferred_pool)}")
            alive = {w.worker_id: w for w in workers.values() if w.state == rm.WORKER_STATE_ALIVE}
            busy, used = self._others(bindings, req.binding_id)
            current = bindings.get(req.binding_id)
            if current is not None and current.request != req:
                current = None  # a different request starts over (the old members are released)
            try:
                pl = place(req, pools, alive, busy, used, current=current)
            except PlacementError as exc:
                raise errors.Unavailable(str(exc)) from None
            b = rm.Binding(
                binding_id=req.binding_id,
                role=req.role,
                replicas=req.replicas,
                workers=pl.workers,
                fallback=pl.fallback,
                degraded=pl.degraded,
                reason=pl.reason,
                request=req,
                updated_at=_ts(),
            )
            await self._commit(bindings={b.binding_id: b}, events=[(ET.RESOURCE_EVENT_TYPE_BINDING_UPDATED, b)])
            log.info("bound", extra=log_fields(binding_id=b.binding_id, reason=b.reason))
            return b

    async def Unbind(self, request: rm.UnbindRequest, context: aio.ServicerContext) -> common_pb2.Nothing:
        async with self.lock:
            raw = cast(bytes | None, await self.redis.hget(self.k_bindings, request.binding_id))
            if raw is None:
                return common_pb2.Nothing()
            b = rm.Binding.FromString(raw)
            await self._commit(
                bindings={request.binding_id: None}, events=[(ET.RESOURCE_EVENT_TYPE_BINDING_REMOVED, b)]
            )
            return common_pb2.Nothing()

    async def GetBinding(self, request: rm.GetBindingRequest, context: aio.ServicerContext) -> rm.Binding:
        raw = cast(bytes | None, await self.redis.hget(self.k_bindings, request.binding_id))
        if raw is None:
            raise errors.NotFound(f"no binding named {errors.shorten(request.binding_id)}")
        return rm.Binding.FromString(raw)

    async def ListBindings(
        self, request: rm.ListBindingsRequest, context: aio.ServicerContext
    ) -> rm.ListBindingsResponse:
        _, _, bindings = await self._load()
        out = [b for _, b in sorted(bindings.items()) if not request.role or b.role == request.role]
        return rm.ListBindingsResponse(bindings=out)

    # ----------------------------------------------------------------------------------------------- watch

    async def Watch(self, request: rm.WatchRequest, context: aio.ServicerContext) -> AsyncIterator[rm.ResourceEvent]:
        if request.from_revision < 0:
            raise errors.InvalidArgument("from_revision", "must be >= 0")
        wanted = set(request.types)
        if request.from_revision > 0:
            first = cast(_Entries, await self.redis.xrange(self.k_events, count=1))
            if first:
                oldest = int(first[0][0].decode().split("-")[0])
                if request.from_revision < oldest - 1:
                    raise errors.OutOfRange(
                        f"revision {request.from_revision} is older than the retained history (oldest {oldest}); "
                        "list the current state and watch from the latest revision",
                    )
        last = f"{request.from_revision}-1" if request.from_revision > 0 else "0-0"
        conn = aioredis.from_url(self.cfg.redis_url)  # a blocking XREAD needs its own connection
        try:
            while True:
                reply = cast(
                    list[tuple[bytes, _Entries]] | None,
                    await conn.xread({self.k_events: last}, block=1000, count=256),
                )
                for _stream, entries in reply or ():
                    for entry_id, fields in entries:
                        last = entry_id.decode()
                        ev = rm.ResourceEvent.FromString(fields[b"e"])
                        if not wanted or ev.type in wanted:
                            yield ev
        finally:
            await conn.aclose()
