"""Fixtures for running the ledger's Lua scripts on their own against a real redis-server.

One private redis-server (loopback, free port) serves the whole session; every test gets its own key prefix,
so tests never see each other's keys. ``store`` is a fresh job with a small policy (groups of 2, a large
buffer) the way the service sets one up; ``blank`` has no policy at all.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis

from rollart.local.processes import start_redis
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart_ledger import codec
from rollart_ledger import policy as pol
from rollart_ledger.scripts import LedgerScripts, NewGroup, Verdict
from tests.integration.ledger.helpers import h, weights


@pytest.fixture(scope="session")
def lua_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_redis(tmp_path_factory.mktemp("lua-redis"), appendfsync="no")
    yield url
    proc.stop()


def text(b: Any) -> str:
    return b.decode(errors="backslashreplace") if isinstance(b, bytes) else str(b)


@dataclass
class Store:
    """One job's keys in the test Redis, its scripts, and builders for the state a script needs."""

    redis: aioredis.Redis
    scripts: LedgerScripts
    prefix: str

    def k(self, name: str) -> str:
        return self.prefix + name

    # ------------------------------------------------------------------------------------------- reading

    async def hash(self, name: str) -> dict[str, str]:
        """A hash as text (blobs come out escaped; the fields tests read hold decimal strings or ids)."""
        return {text(k): text(v) for k, v in (await self.redis.hgetall(self.k(name))).items() if k != b"blob"}

    async def get(self, name: str) -> str | None:
        v = await self.redis.get(self.k(name))
        return None if v is None else text(v)

    async def zmembers(self, name: str) -> list[str]:
        return [text(m) for m in await self.redis.zrange(self.k(name), 0, -1)]

    async def lease(self, lease_id: str) -> dict[str, str]:
        return await self.hash("l:" + lease_id)

    async def group(self, group_id: str) -> dict[str, str]:
        g = await self.redis.hgetall(self.k("g:" + group_id))
        return {text(k): text(v) for k, v in g.items() if k != b"prompt"}

    async def commands(self) -> list[lp.LedgerCommand]:
        return [codec.command_from(eid, f) for eid, f in await self.redis.xrange(self.k("cmds"))]

    # ------------------------------------------------------------------------------------------ building

    async def policy(self, job: str = "job-1", **kw: Any) -> lp.JobPolicy:
        kw.setdefault("group_size", 2)
        kw.setdefault("buffer_capacity", 100_000)
        filled = pol.fill(lp.JobPolicy(job_id=job, **kw), "")
        await self.scripts.set_policy(filled)
        return filled

    async def version(self, v: int, digest: bytes | None = None) -> common_pb2.PolicyVersion:
        pv = common_pb2.PolicyVersion(version=v, base_version=v - 1, hash=digest or h(v))
        await self.scripts.register_version(pv)
        return pv

    async def actor(self, aid: str, active: int = 0, staged: tuple[int, ...] = (), **kw: Any) -> dict[str, bytes]:
        a = lp.LedgerActor(actor_id=aid, endpoint="127.0.0.1:7000", weights=weights(active, staged), **kw)
        return await self.scripts.register_actor(a)

    async def prompts(self, n: int, group_size: int = 2, redundancy: int = 0, priority: int = 0, prefix: str = "p",
                      task: str = "math", group_ids: list[str] | None = None) -> list[str]:
        groups = [
            NewGroup((group_ids or [""] * n)[i], f"{prefix}{i}", task, lp.Prompt(prompt_id=f"{prefix}{i}").SerializeToString())
            for i in range(n)
        ]
        added = await self.scripts.add_prompts(
            group_size=group_size, redundancy=redundancy, step=0, priority=priority, groups=groups
        )
        return added.group_ids

    async def acquire(self, holder: str = "env-1", n: int = 1, **kw: Any) -> list[lp.Lease]:
        kw.setdefault("region", "")
        kw.setdefault("group_id", "")
        kw.setdefault("tasks", ())
        got = await self.scripts.acquire(holder=holder, max_leases=n, **kw)
        return got.leases

    async def submit(self, lease: lp.Lease, tid: str | None = None, **kw: Any) -> Verdict:
        v = lease.version
        args: dict[str, Any] = dict(
            lease_id=lease.lease_id,
            trajectory_id=tid or f"t-{lease.lease_id}",
            holder=lease.holder,
            lease_version=v,
            ok=True,
            token_versions=(v, v),
            scored=True,
            reward=1.0,
            trajectory=b"traj",
            tau_window_ms=5000,
            version_hashes={v: h(v)},
            work=(),
        )
        args.update(kw)
        return await self.scripts.submit(**args)

    async def ready_job(self, groups: int = 1, **policy: Any) -> list[str]:
        """A job with version 0 registered and ``groups`` groups of 2 in the pool."""
        await self.policy(**policy)
        await self.version(0)
        return await self.prompts(groups)


async def _store(url: str) -> tuple[aioredis.Redis, Store]:
    client = aioredis.from_url(url)
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    scripts = LedgerScripts(client, prefix)
    await scripts.load()
    return client, Store(client, scripts, prefix)


@pytest.fixture
async def blank(lua_redis_url: str) -> AsyncIterator[Store]:
    """A job with no keys at all (not even the default policy)."""
    client, store = await _store(lua_redis_url)
    yield store
    await client.aclose()


@pytest.fixture
async def store(lua_redis_url: str) -> AsyncIterator[Store]:
    """A job with the default policy in force (as the service's start writes it)."""
    client, store = await _store(lua_redis_url)
    await store.scripts.ensure_policy(pol.defaults(""))
    yield store
    await client.aclose()
