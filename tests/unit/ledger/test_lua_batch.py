"""acquire_batch and submit_batch against a real Redis: one script run per batch gives every item what its
single-item script (acquire, submit) run after the items before it gives, item by item; a refused item is
refused alone and changes nothing.

The equivalence tests build the same job under two key prefixes, run the calls one by one on the first and as
one batch on the second, and compare the replies and the state they leave (times aside)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from rollart.v1 import ledger_pb2 as lp
from rollart_ledger import policy as pol
from rollart_ledger.errors import LedgerError
from rollart_ledger.scripts import AcquireArgs, Submission, Verdict
from tests.integration.ledger.helpers import h
from tests.unit.ledger.conftest import Store, _store

TIMES = {"iss", "exp", "end", "created", "hb", "reg", "ws"}


@pytest.fixture
async def twin(lua_redis_url: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two jobs (key prefixes) on the test Redis, each with the default policy in force."""
    ca, a = await _store(lua_redis_url)
    cb, b = await _store(lua_redis_url)
    for s in (a, b):
        await s.scripts.ensure_policy(pol.defaults(""))
    yield a, b
    await ca.aclose()
    await cb.aclose()


async def both(twin: tuple[Store, Store], build: Any) -> None:
    for s in twin:
        await build(s)


async def state(s: Store) -> dict[str, Any]:
    """What acquire and submit change, times left out."""
    out: dict[str, Any] = {}
    for key in sorted(await s.redis.keys(s.prefix + "*")):
        name = key.decode()[len(s.prefix):]
        kind = (await s.redis.type(key)).decode()
        if kind == "hash":
            out[name] = {k: v for k, v in (await s.hash(name)).items() if k not in TIMES}
        elif kind == "zset":
            zs = await s.redis.zrange(key, 0, -1, withscores=True)
            timed = name in {"active", "ended", "holders", "gended", "unscored"}
            out[name] = sorted(m.decode() for m, _ in zs) if timed else [(m.decode(), sc) for m, sc in zs]
        elif kind == "set":
            out[name] = sorted(m.decode() for m in await s.redis.smembers(key))
        elif kind == "string":
            out[name] = await s.get(name)
        elif kind == "list":
            out[name] = len(await s.redis.lrange(key, 0, -1))  # completion times: their count
        elif kind == "stream":
            out[name] = [(eid, {k: v for k, v in f.items() if k != b"ts"}) for eid, f in await s.redis.xrange(key)]
    out.pop("med", None)
    out.pop("ttl", None)  # the median of completion times, in ms: depends on the clock
    return out


def lease_view(x: Any) -> Any:
    if isinstance(x, LedgerError):
        return ("error", x.code, x.message)
    return (x.status, [(le.lease_id, le.group_id, le.sample_index, le.holder, le.attempt, le.version,
                        le.version_hash, le.prompt.prompt_id) for le in x.leases])  # fmt: skip


def verdict_view(x: Any) -> Any:
    if isinstance(x, LedgerError):
        return ("error", x.code, x.message)
    assert isinstance(x, Verdict)
    lease = x.lease
    return (x.admitted, x.reason, x.detail, x.duplicate, x.group_complete, x.group_admitted, x.awaiting_reward,
            None if lease is None else (lease.lease_id, lease.state, lease.trajectory_id))  # fmt: skip


async def acquire_each(s: Store, requests: list[AcquireArgs]) -> list[Any]:
    out: list[Any] = []
    for r in requests:
        try:
            out.append(await s.scripts.acquire(holder=r.holder, max_leases=r.max_leases, region=r.region,
                                               group_id=r.group_id, tasks=r.tasks))  # fmt: skip
        except LedgerError as exc:
            out.append(exc)
    return out


async def submit_each(s: Store, subs: list[Submission]) -> list[Any]:
    out: list[Any] = []
    for x in subs:
        try:
            out.append(await s.scripts.settle(x))
        except LedgerError as exc:
            out.append(exc)
    return out


def result(lease: lp.Lease, tid: str | None = None, **kw: Any) -> Submission:
    v = lease.version
    args: dict[str, Any] = dict(
        lease_id=lease.lease_id, trajectory_id=tid or f"t-{lease.lease_id}", holder=lease.holder, lease_version=v,
        ok=True, token_versions=(v, v), scored=True, reward=1.0, trajectory=b"traj", tau_window_ms=5000,
        version_hashes={v: h(v)}, work=(), generated_tokens=7,
    )  # fmt: skip
    args.update(kw)
    return Submission(**args)


async def job(s: Store) -> None:
    """Groups of 4 (one redundant slot), a capacity of 3 groups in flight, two tasks and two priorities; one
    group started by an earlier holder with one result admitted, so started and fresh groups compete."""
    await s.policy(group_size=4, buffer_capacity=12)
    await s.version(0)
    await s.prompts(6, group_size=4, redundancy=1, prefix="a", task="math")
    await s.prompts(3, group_size=4, redundancy=1, prefix="b", task="code", priority=5)
    await s.prompts(1, group_size=4, redundancy=1, prefix="g", group_ids=["gx"])
    early = await s.acquire("early", 3)
    await s.submit(early[0])


class TestAcquireBatch:
    REQUESTS = [
        AcquireArgs("h1", 1),
        AcquireArgs("h2", 3),
        AcquireArgs("h3", 2, group_id="gx"),
        AcquireArgs("h4", 1, group_id="no-such-group"),
        AcquireArgs("h5", 6),
        AcquireArgs("h6", 2, tasks=("code",)),
        AcquireArgs("h7", 1),
        AcquireArgs("h8", 4),
        AcquireArgs("h9", 20),
    ]

    async def test_each_request_gets_what_acquire_after_the_ones_before_it_gives(self, twin):
        await both(twin, job)
        one, many = twin
        each = await acquire_each(one, self.REQUESTS)
        batch = await many.scripts.acquire_batch(self.REQUESTS)
        assert [lease_view(x) for x in batch] == [lease_view(x) for x in each]
        assert await state(many) == await state(one)
        # the mix covered what matters: leases, a refusal, and back-pressure (the capacity reached)
        kinds = [x.status if not isinstance(x, LedgerError) else x.code for x in batch]
        assert kinds.count("NOT_FOUND") == 1 and kinds.count("ok") >= 5 and "empty" in kinds
        assert sum(len(x.leases) for x in batch if not isinstance(x, LedgerError)) >= 10

    async def test_a_batch_runs_dry_as_the_calls_would_and_expired_leases_are_reused(self, twin):
        async def small(s: Store) -> None:
            await s.policy(group_size=2, buffer_capacity=100)
            await s.version(0)
            await s.prompts(3)
            for le in await s.acquire("old", 2):  # expired before the batch: their slots go back to the pool
                await s.redis.hset(s.k("l:" + le.lease_id), "exp", 1)
                await s.redis.zadd(s.k("active"), {le.lease_id: 1})

        await both(twin, small)
        one, many = twin
        reqs = [AcquireArgs(f"e{i}", 2) for i in range(5)]
        each = await acquire_each(one, reqs)
        batch = await many.scripts.acquire_batch(reqs)
        assert [lease_view(x) for x in batch] == [lease_view(x) for x in each]
        assert [x.status for x in batch] == ["ok", "ok", "ok", "empty", "empty"]
        assert await state(many) == await state(one)

    async def test_no_version_yet_and_an_empty_batch_reply(self, store):
        await store.policy()
        got = await store.scripts.acquire_batch([AcquireArgs("a", 1), AcquireArgs("b", 1, group_id="nope")])
        assert got[0].status == "noversion" and isinstance(got[1], LedgerError) and got[1].code == "NOT_FOUND"
        assert await store.scripts.acquire_batch([]) == []

    async def test_one_script_run_per_batch(self, store):
        await store.ready_job(groups=8)
        await store.redis.config_resetstat()
        got = await store.scripts.acquire_batch([AcquireArgs(f"e{i}", 1) for i in range(16)])
        assert all(x.status == "ok" for x in got)
        stats = await store.redis.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 1


    async def test_a_new_leases_row_is_its_hash_as_stored(self, store):
        """acquire builds a new lease's row from what it wrote (no read back): the same as HGETALL, in order."""
        await store.ready_job(groups=4)
        out = await store.scripts._run("acquire", ["env/1", 4, "", "", 0])
        rows = await store.scripts._run("acquire_batch", [2, 5, "env/2", 1, "", "", 0, 5, "env/3", 2, "", "", 0])
        rows = [out[1:], rows[0][1][1:], rows[1][1][1:]]
        assert [len(r) for r in rows] == [4, 1, 2]
        for row in (r for rs in rows for r in rs):
            flat, prompt, vhash = row
            lid = dict(zip(flat[::2], flat[1::2]))[b"id"].decode()
            stored = await store.redis.eval("return redis.call('HGETALL', KEYS[1])", 1, store.k("l:" + lid))
            assert flat == stored  # the same fields and values, in the same order
            gid = dict(zip(flat[::2], flat[1::2]))[b"gid"]
            assert prompt == await store.redis.hget(store.k("g:" + gid.decode()), "prompt") and vhash == h(0)


class TestSubmitBatch:
    async def test_each_result_is_settled_as_submit_after_the_ones_before_it_settles_it(self, twin):
        leases: dict[str, list[lp.Lease]] = {}

        async def leased(s: Store) -> None:
            await job(s)
            leases[s.prefix] = await s.acquire("w", 12)

        await both(twin, leased)
        one, many = twin
        assert len(leases[one.prefix]) == 12

        def subs(s: Store) -> list[Submission]:
            ls = leases[s.prefix]
            return [
                result(ls[0]),
                result(ls[1], ok=False),  # did not end normally: rejected, its slot back to the pool
                result(ls[2], holder="someone-else"),  # WRONG_HOLDER: nothing changes
                result(ls[3]),
                result(ls[4], tid="t-L1"),  # the trajectory id of another lease (job's first): refused alone
                result(lp.Lease(lease_id="L999", holder="w", version=0)),  # UNKNOWN_LEASE
                result(ls[5], lease_version=3),  # claims another version
                result(ls[6], scored=False),  # admitted, awaiting its reward
                *[result(le) for le in ls[7:]],  # enough to complete groups and cancel their redundant leases
            ]

        each = await submit_each(one, subs(one))
        batch = await many.scripts.submit_batch(subs(many))
        assert [verdict_view(x) for x in batch] == [verdict_view(x) for x in each]
        assert await state(many) == await state(one)
        assert isinstance(batch[4], LedgerError) and batch[4].code == "ALREADY_EXISTS"
        assert any(not isinstance(x, LedgerError) and x.group_complete for x in batch)
        # idempotent per lease and trajectory: the same batch again answers the first verdicts, as duplicates
        again = await many.scripts.submit_batch(subs(many))
        for first, second in zip(batch, again):
            if isinstance(first, LedgerError):
                assert isinstance(second, LedgerError) and second.code == first.code
            elif first.reason == lp.REJECTION_REASON_UNKNOWN_LEASE or first.reason == lp.REJECTION_REASON_WRONG_HOLDER:
                assert verdict_view(second) == verdict_view(first)  # never recorded: judged again, the same
            else:
                assert second.duplicate and verdict_view(second)[:3] == verdict_view(first)[:3]
        admitted = (await many.hash("stats"))["admitted"]
        assert admitted == (await one.hash("stats"))["admitted"]

    async def test_the_first_verdict_stands_within_one_batch(self, store):
        await store.ready_job(groups=2)
        le = (await store.acquire("w", 1))[0]
        first, second = await store.scripts.submit_batch([result(le), result(le, reward=0.0, ok=False)])
        # the second result for the same lease (another trajectory id would be refused by the service; the same
        # id) answers the first verdict as a duplicate
        assert first.admitted and second.duplicate and second.admitted
        assert (await store.get("buf:n")) == "1"

    async def test_one_script_run_per_batch(self, store):
        await store.ready_job(groups=8)
        leases = await store.acquire("w", 16)
        await store.redis.config_resetstat()
        got = await store.scripts.submit_batch([result(le) for le in leases])
        assert all(v.admitted for v in got)
        assert (await store.redis.info("commandstats"))["cmdstat_evalsha"]["calls"] == 1
