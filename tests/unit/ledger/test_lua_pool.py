"""add_prompts, acquire, renew, release and cancel, each run on its own against a real Redis."""

from __future__ import annotations

import pytest

from rollart.v1 import ledger_pb2 as lp
from rollart_ledger.errors import LedgerError
from rollart_ledger.scripts import NewGroup

ACTIVE, EXPIRED, CANCELLED, RELEASED = (
    lp.LEASE_STATE_ACTIVE,
    lp.LEASE_STATE_EXPIRED,
    lp.LEASE_STATE_CANCELLED,
    lp.LEASE_STATE_RELEASED,
)


def slot(lease: lp.Lease) -> str:
    return f"{lease.group_id}|{lease.sample_index}"


async def expire(store, lease: lp.Lease) -> None:
    """Moves a lease's expiry into the past (as if its TTL had run out)."""
    await store.redis.hset(store.k("l:" + lease.lease_id), "exp", 1)
    await store.redis.zadd(store.k("active"), {lease.lease_id: 1})


class TestAddPrompts:
    async def test_each_prompt_becomes_a_group_of_g_plus_r_pending_slots(self, store):
        await store.policy()
        added = await store.scripts.add_prompts(
            group_size=2,
            redundancy=1,
            step=3,
            priority=0,
            groups=[NewGroup("", "p0", "math", b"prompt-0"), NewGroup("g-x", "p1", "code", b"prompt-1")],
        )
        assert (added.groups_created, added.samples_added) == (2, 6)
        auto, named = added.group_ids
        assert auto.startswith("p0#") and named == "g-x"
        g = await store.group(named)
        assert (g["st"], g["G"], g["R"], g["n"], g["task"], g["step"]) == ("O", "2", "1", "3", "code", "3")
        assert [g[f"s{i}"] for i in range(3)] == ["P", "P", "P"]
        assert await store.redis.hget(store.k("g:" + named), "prompt") == b"prompt-1"
        assert len(await store.zmembers("pool")) == 6 and len(await store.zmembers("pool:t:code")) == 3
        assert await store.redis.smembers(store.k("gopen")) == {auto.encode(), b"g-x"}

    async def test_an_existing_or_purged_group_id_is_left_alone(self, store):
        await store.policy()
        await store.prompts(1, group_ids=["g1"])
        await store.redis.sadd(store.k("gdone"), "g2")
        again = await store.scripts.add_prompts(
            group_size=4, redundancy=0, step=0, priority=0,
            groups=[NewGroup("g1", "p9", "math", b""), NewGroup("g2", "p9", "math", b"")],
        )  # fmt: skip
        assert again.group_ids == ["g1", "g2"] and (again.groups_created, again.samples_added) == (0, 0)
        assert (await store.group("g1"))["G"] == "2"
        assert await store.redis.exists(store.k("g:g2")) == 0

    async def test_pool_order_is_priority_then_fifo(self, store):
        await store.policy()
        low = await store.prompts(1, prefix="low", priority=0)
        high = await store.prompts(1, prefix="high", priority=5)
        later = await store.prompts(1, prefix="later", priority=0)
        order = [m.split("|")[0] for m in await store.zmembers("pool")]
        assert order == high * 2 + low * 2 + later * 2


class TestAcquire:
    async def test_without_a_version_nothing_is_leased(self, store):
        await store.policy()
        await store.prompts(1)
        got = await store.scripts.acquire(holder="env-1", max_leases=1, region="", group_id="", tasks=())
        assert got.status == "noversion" and got.leases == []
        assert len(await store.zmembers("pool")) == 2

    async def test_an_empty_pool_is_empty(self, store):
        await store.policy()
        await store.version(0)
        got = await store.scripts.acquire(holder="env-1", max_leases=1, region="", group_id="", tasks=())
        assert got.status == "empty"

    async def test_issues_leases_on_the_latest_version_for_the_ttl_in_force(self, store):
        [gid] = await store.ready_job()
        await store.version(1)
        leases = await store.acquire(n=5)
        assert [(le.group_id, le.sample_index) for le in leases] == [(gid, 0), (gid, 1)]
        le = leases[0]
        assert le.version == 1 and le.holder == "env-1" and le.state == ACTIVE and le.attempt == 1
        assert le.prompt.prompt_id == "p0" and le.version_hash == await store.redis.hget(store.k("vhash"), "1")
        ttl = int(await store.get("ttl"))
        assert le.expires_at.ToMilliseconds() - le.issued_at.ToMilliseconds() == ttl
        g = await store.group(gid)
        assert g["s0"] == f"L:{le.lease_id}" and g["started"] == "1" and g["a0"] == "1"
        assert await store.zmembers("pool") == []
        assert (await store.hash("cnt"))[str(ACTIVE)] == "2"
        assert await store.get("inflight") == "2"

    async def test_filters_by_task_and_group(self, store):
        await store.ready_job()
        code = await store.prompts(1, prefix="c", task="code")
        [le] = await store.acquire(tasks=["code"])
        assert le.group_id == code[0]
        [le] = await store.acquire(group_id=code[0])
        assert le.group_id == code[0]
        with pytest.raises(LedgerError) as exc:
            await store.acquire(group_id="nope")
        assert exc.value.code == "NOT_FOUND"

    async def test_due_leases_expire_first_and_their_slots_are_leased_again(self, store):
        await store.ready_job()
        first, _ = await store.acquire(n=2)
        await expire(store, first)
        [again] = await store.acquire(holder="env-2")
        assert slot(again) == slot(first) and again.attempt == 2
        assert (await store.lease(first.lease_id))["st"] == str(EXPIRED)

    async def test_back_pressure_starts_no_new_group_beyond_the_capacity(self, store):
        await store.ready_job(groups=2, buffer_capacity=2)
        got = await store.acquire(n=4)
        assert len(got) == 2 and len({le.group_id for le in got}) == 1  # the second group would not fit
        assert await store.get("inflight") == "2"

    async def test_assigns_to_the_actor_with_most_quota_left_same_region_first(self, store):
        await store.ready_job(groups=3)
        await store.actor("far", region="us")
        await store.actor("near", region="eu")
        await store.redis.hset(store.k("quota"), mapping={"far": 3, "near": 1})
        got = await store.acquire(n=4, region="eu")
        assert [le.assigned_actor_id for le in got] == ["near", "far", "far", "far"]
        assert await store.hash("quota") == {"far": "0", "near": "0"}
        assert await store.redis.smembers(store.k("as:far")) == {le.lease_id.encode() for le in got[1:]}


class TestRenew:
    async def test_extends_an_active_lease(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        await store.redis.hset(store.k("l:" + le.lease_id), "exp", le.expires_at.ToMilliseconds() - 60_000)
        renewed = await store.scripts.renew(lease_id=le.lease_id, holder="env-1")
        assert renewed.state == ACTIVE and renewed.expires_at.ToMilliseconds() >= le.expires_at.ToMilliseconds()
        score = await store.redis.zscore(store.k("active"), le.lease_id)
        assert int(score) == renewed.expires_at.ToMilliseconds()

    async def test_an_expired_lease_expires_instead(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        await expire(store, le)
        got = await store.scripts.renew(lease_id=le.lease_id, holder="env-1")
        assert got.state == EXPIRED
        assert slot(le) in await store.zmembers("pool")

    async def test_unknown_lease_and_wrong_holder_are_refused(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        with pytest.raises(LedgerError) as exc:
            await store.scripts.renew(lease_id="L999", holder="env-1")
        assert exc.value.code == "NOT_FOUND"
        with pytest.raises(LedgerError) as exc:
            await store.scripts.renew(lease_id=le.lease_id, holder="env-2")
        assert exc.value.code == "FAILED_PRECONDITION"
        assert (await store.lease(le.lease_id))["exp"] == str(le.expires_at.ToMilliseconds())


class TestRelease:
    async def test_returns_the_sample_to_the_pool_once(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        got = await store.scripts.release(lease_id=le.lease_id, holder="env-1", reason=lp.RELEASE_REASON_TIMEOUT)
        assert got.changed and got.lease.state == RELEASED and got.lease.release_reason == lp.RELEASE_REASON_TIMEOUT
        assert slot(le) in await store.zmembers("pool")
        assert await store.redis.smembers(store.k("h:env-1")) == set()
        again = await store.scripts.release(lease_id=le.lease_id, holder="env-1", reason=lp.RELEASE_REASON_ABANDONED)
        assert not again.changed and again.lease.release_reason == lp.RELEASE_REASON_TIMEOUT

    async def test_after_max_attempts_the_slot_closes_and_the_group_is_dropped(self, store):
        await store.ready_job(max_lease_attempts=1)
        a, b = await store.acquire(n=2)
        await store.scripts.release(lease_id=a.lease_id, holder="env-1", reason=lp.RELEASE_REASON_ABANDONED)
        g = await store.group(a.group_id)
        assert g["st"] == "D" and g["s0"] == "X" and g["s1"] == "X"  # can no longer reach G = 2
        assert (await store.lease(b.lease_id))["can"] == str(lp.CANCEL_REASON_GROUP_DROPPED)
        assert (await store.hash("stats"))["dropped"] == "1"
        assert await store.get("inflight") == "0"

    async def test_wrong_holder_is_refused(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        with pytest.raises(LedgerError) as exc:
            await store.scripts.release(lease_id=le.lease_id, holder="env-2", reason=1)
        assert exc.value.code == "FAILED_PRECONDITION"
        assert (await store.lease(le.lease_id))["st"] == str(ACTIVE)


class TestCancel:
    async def test_manual_closes_the_slot_and_tells_the_holder(self, store):
        await store.ready_job(redundancy=1)
        await store.prompts(1, prefix="q", redundancy=1, group_ids=["g9"])
        leases = await store.acquire(group_id="g9", n=3)
        out = await store.scripts.cancel(reason=lp.CANCEL_REASON_MANUAL, lease_ids=[leases[0].lease_id], group_ids=[])
        assert out == [leases[0].lease_id]
        assert (await store.group("g9"))[f"s{leases[0].sample_index}"] == "X"
        cmd = (await store.commands())[-1]
        assert cmd.target == "env-1" and list(cmd.cancel_leases.lease_ids) == out
        assert cmd.cancel_leases.reason == lp.CANCEL_REASON_MANUAL

    async def test_stale_returns_the_slot_to_the_pool(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        await store.scripts.cancel(reason=lp.CANCEL_REASON_STALE, lease_ids=[le.lease_id], group_ids=[])
        assert (await store.lease(le.lease_id))["st"] == str(CANCELLED)
        assert slot(le) in await store.zmembers("pool")

    async def test_by_group_cancels_its_active_leases_only(self, store):
        [gid] = await store.ready_job()
        a, b = await store.acquire(n=2)
        await store.scripts.release(lease_id=a.lease_id, holder="env-1", reason=1)
        out = await store.scripts.cancel(reason=lp.CANCEL_REASON_STALE, lease_ids=[], group_ids=[gid])
        assert out == [b.lease_id]

    async def test_an_unknown_id_refuses_the_whole_call(self, store):
        [gid] = await store.ready_job()
        [le] = await store.acquire()
        for ids, groups in (([le.lease_id, "L404"], []), ([le.lease_id], ["nope"])):
            with pytest.raises(LedgerError) as exc:
                await store.scripts.cancel(reason=lp.CANCEL_REASON_MANUAL, lease_ids=ids, group_ids=groups)
            assert exc.value.code == "NOT_FOUND"
        assert (await store.lease(le.lease_id))["st"] == str(ACTIVE)
        assert not any(c.HasField("cancel_leases") for c in await store.commands())
