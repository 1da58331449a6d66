"""The ledger's shared state: the Redis client and scripts, the wake-up signal, and the reads every part uses.

Every state change is one atomic step in Redis: a Lua script (scripts.py) for leases, settlement, the buffer,
actors and versions, and a WATCH/MULTI transaction around a script for step planning (planning.py). Nothing is
kept in this process beyond a wake-up signal for waiting calls, so several ledger processes may serve the same
store and a restarted one serves the same state. See docs/ledger.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import hiredis
import redis.asyncio as aioredis
from prometheus_client import Counter, Gauge

from rollart.runtime.background import Periodic
from rollart.runtime.telemetry import log_fields
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp

from . import codec
from . import policy as pol
from .config import LedgerConfig
from .planning import StepPlanner
from .scripts import LedgerScripts, now_ms

log = logging.getLogger(__name__)
# redis-py types every reply as bytes | str; this client never decodes, so its replies are bytes (casts below).
Entries = list[tuple[bytes, dict[bytes, bytes]]]

# This replica's view of the newest registered version (set on registration and status reads; dashboards take
# the max over replicas and compare each actor's rollart_actor_weight_version with it).
LATEST_VERSION = Gauge("rollart_ledger_latest_version", "Newest registered policy version seen by this replica")
LEASES_EXPIRED = Counter("rollart_ledger_leases_expired_total", "Sample leases expired by the reaper")
SCORES_EXPIRED = Counter(
    "rollart_ledger_scores_expired_total", "Admitted samples un-admitted as failed: no reward within the score deadline"
)


class _Signal:
    """Wakes waiting calls when this process changed something (other changes are found by polling)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        return self._event

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    @staticmethod
    async def wait(event: asyncio.Event, timeout: float) -> None:
        if timeout <= 0:
            return
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass


class _HiredisPackingConnection(aioredis.Connection):
    """Packs commands with hiredis's C packer. redis-py's asyncio connection packs in Python (~0.7 us an argument:
    5-7% of the ledger's CPU with batches of ~20 arguments per item); the bytes are the same (hiredis writes str
    as UTF-8 and floats as their repr, as redis-py's encoder does)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str) and " " in args[0]:  # 'SCRIPT LOAD': the name's words are separate arguments
            args = (*args[0].split(), *args[1:])
        return [hiredis.pack_command(args)]


class Store:
    """What every part of the ledger shares (one per process)."""

    def __init__(self, cfg: LedgerConfig) -> None:
        self.cfg = cfg
        # A bounded pool that makes a handler wait for a free connection: redis-py's default pool (100) fails a
        # call outright once that many handlers use Redis at once (e.g. 256 actors heartbeating together).
        plain_tcp = cfg.redis_url.startswith("redis://")  # (unix:// and rediss:// keep their own connections)
        pool = aioredis.BlockingConnectionPool.from_url(
            cfg.redis_url,
            max_connections=cfg.redis_max_connections,
            timeout=20,
            **({"connection_class": _HiredisPackingConnection} if plain_tcp else {}),
        )
        self.redis = aioredis.Redis.from_pool(pool)  # closes the pool with the client
        self.p = cfg.key_prefix
        self.scripts = LedgerScripts(self.redis, self.p)
        self.planner = StepPlanner(self.redis, self.scripts, self.p)
        self.signal = _Signal()
        self._reaper = Periodic(self.reap, cfg.reap_interval_seconds, name="ledger-reaper")
        self._last_trim = 0.0

    def k(self, name: str) -> str:
        return self.p + name

    async def start(self) -> None:
        await self.redis.ping()
        await self.scripts.load()
        if self.cfg.job_id:
            job = cast(bytes | None, await self.redis.get(self.k("job")))
            if job is not None and job.decode() != self.cfg.job_id:
                raise RuntimeError(
                    f"the store under {self.p!r} belongs to job {job.decode()!r}, not {self.cfg.job_id!r}"
                )
        await self.scripts.ensure_policy(pol.defaults(self.cfg.job_id))
        self._reaper.start()

    async def close(self) -> None:
        await self._reaper.stop()
        await self.redis.aclose()

    async def policy(self, pending: bool = False) -> dict[str, float]:
        """The policy in force (or, with pending, the one the next PlanStep installs)."""
        h: dict = {}
        if pending:
            h = await self.redis.hgetall(self.k("pol:next"))
        if not h:
            h = await self.redis.hgetall(self.k("pol"))
        return pol.numbers(h)

    async def versions(self, lo: Any, hi: Any, limit: int) -> list[common_pb2.PolicyVersion]:
        numbers = cast(list[bytes], await self.redis.zrevrangebyscore(self.k("vers"), hi, lo, start=0, num=limit))
        if not numbers:
            return []
        blobs = cast(list[bytes | None], await self.redis.hmget(self.k("versions"), list(reversed(numbers))))
        return [common_pb2.PolicyVersion.FromString(b) for b in blobs if b is not None]

    async def actors(self, ids: list[str] | None = None) -> dict[str, lp.LedgerActor]:
        if ids is None:
            ids = sorted(m.decode() for m in cast(set[bytes], await self.redis.smembers(self.k("actors"))))
        pipe = self.redis.pipeline(transaction=False)
        for aid in ids:
            pipe.hgetall(self.k("a:" + aid))
        rows = await pipe.execute()
        policy = await self.policy()
        now = now_ms()
        return {
            aid: codec.actor_from(codec.hdict(h), now, policy["tout"])
            for aid, h in zip(ids, rows)
            if h.get(b"info")
        }

    async def accounting(self) -> common_pb2.GenerationAccounting:
        stats = cast(dict[bytes, bytes], await self.redis.hgetall(self.k("stats")))
        return codec.accounting({k.decode(): int(v) for k, v in stats.items()})

    def bounded_wait(self, wait: float, time_remaining: float | None) -> float:
        """``wait`` capped by the configured maximum and by the caller's deadline (answer before it)."""
        wait = min(wait, self.cfg.max_wait_seconds)
        if time_remaining is not None:
            wait = min(wait, max(time_remaining - 0.05, 0.0))
        return wait

    # ------------------------------------------------------------------------------------------------ reaper

    async def reap(self) -> None:
        reaped = await self.scripts.reap(
            lease_retention_ms=int(self.cfg.lease_retention_seconds * 1000),
            actor_retention_ms=int(self.cfg.actor_retention_seconds * 1000),
            score_deadline_ms=int(self.cfg.score_deadline_seconds * 1000),
        )
        expired, dead = reaped.expired, reaped.presumed_dead
        if expired or dead or reaped.unscored_expired:
            LEASES_EXPIRED.inc(expired)
            self.signal.fire()
            if dead:
                log.info("actors presumed dead", extra=log_fields(count=dead))
            if reaped.unscored_expired:
                SCORES_EXPIRED.inc(reaped.unscored_expired)
                log.warning("admitted samples left unscored past the score deadline: un-admitted as failed",
                            extra=log_fields(count=reaped.unscored_expired,
                                             deadline_seconds=self.cfg.score_deadline_seconds))
        if time.monotonic() - self._last_trim > 1.0:
            self._last_trim = time.monotonic()
            await self._trim_commands()

    async def _trim_commands(self) -> None:
        policy = await self.policy()
        cutoff = now_ms() - policy["ret"]
        key = self.k("cmds")
        start = "-"
        for _ in range(10):  # bounded work per tick
            entries = cast(Entries, await self.redis.xrange(key, min=start, count=500))
            if not entries:
                break
            fresh = next((eid for eid, f in entries if float(f.get(b"ts", b"0")) >= cutoff), None)
            if fresh is not None:
                await self.redis.xtrim(key, minid=fresh.decode())
                break
            last = entries[-1][0].decode()
            start = "(" + last
            await self.redis.xtrim(key, minid=f"{int(last.split('-')[0]) + 1}-0")
        await self.redis.xtrim(key, maxlen=self.cfg.command_history, approximate=True)


class Part:
    """A part of the ledger's core: the shared state under the names the parts' code uses."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cfg = store.cfg
        self.redis = store.redis
        self.p = store.p
        self.scripts = store.scripts
        self.planner = store.planner
        self.signal = store.signal
        self.k = store.k
        self.policy = store.policy
        self.versions = store.versions
        self.actors = store.actors
        self.accounting = store.accounting
