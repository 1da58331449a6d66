"""plan_commit and reap, each run on its own against a real Redis."""

from __future__ import annotations

from rollart.v1 import ledger_pb2 as lp
from rollart_ledger import policy as pol
from rollart_ledger.scripts import Command, TauUpdate

K = lp.SubscriberKind


async def plan_commit(store, step=1, version=0, batch_size=4, quotas=(), taus=None, commands=()):
    return await store.scripts.plan_commit(
        step=step,
        version=version,
        batch_size=batch_size,
        plan=lp.StepPlan(step=step, version=version, batch_size=batch_size),
        quotas=list(quotas),
        tau_updates=taus or {},
        commands=list(commands),
    )


class TestPlanCommit:
    async def test_installs_the_plan_quotas_taus_and_commands_in_order(self, store):
        await store.ready_job()
        await store.actor("a1")
        await store.actor("a2")
        commit = lp.LedgerCommand(commit={"order_id": "o1", "version": 0})
        planned = lp.LedgerCommand(step_planned=lp.StepPlan(step=1))
        stale = await plan_commit(
            store,
            quotas=[("a1", 3), ("a2", 0)],
            taus={"a1": TauUpdate(250.5, 0), "a2": TauUpdate(10.0, 2)},
            commands=[
                Command("a1", (K.SUBSCRIBER_KIND_ACTOR,), True, commit),
                Command("", (K.SUBSCRIBER_KIND_ROUTER, K.SUBSCRIBER_KIND_TRAINER), False, planned),
            ],
        )
        assert stale == 0
        assert lp.StepPlan.FromString(await store.redis.get(store.k("plan:1"))).batch_size == 4
        assert await store.zmembers("plans") == ["1"]
        assert await store.hash("cur") == {"step": "1", "v": "0", "B": "4"}
        assert await store.hash("quota") == {"a1": "3"}  # a zero share is not written
        a1, a2 = await store.hash("a:a1"), await store.hash("a:a2")
        assert (float(a1["tau"]), a1["excl"], float(a2["tau"]), a2["excl"]) == (250.5, "0", 10.0, "2")
        *_, c1, c2 = await store.commands()
        assert c1.target == "a1" and c1.ack_required and c1.commit.order_id == "o1"
        assert c2.target == "" and list(c2.kinds) == [K.SUBSCRIBER_KIND_ROUTER, K.SUBSCRIBER_KIND_TRAINER]
        assert c2.sequence == c1.sequence + 1

    async def test_installs_the_pending_policy_first(self, store):
        await store.ready_job(group_size=2)
        await store.redis.hset(store.k("cur"), mapping={"step": 1, "v": 0, "B": 2})
        await store.scripts.set_policy(pol.fill(lp.JobPolicy(job_id="job-1", group_size=6), ""))
        await plan_commit(store, step=2)
        assert (await store.hash("pol"))["G"] == "6.0"
        assert await store.redis.exists(store.k("pol:next")) == 0

    async def test_cancels_leases_older_than_n_minus_alpha_and_repools_them(self, store):
        await store.ready_job(alpha=1)
        old = await store.acquire(n=2)  # v_j = 0
        await store.version(1)
        await store.version(2)
        assert await plan_commit(store, version=1) == 0  # floor 0: still admissible
        assert await plan_commit(store, step=2, version=2) == 2  # floor 1
        for le in old:
            row = await store.lease(le.lease_id)
            assert row["st"] == str(lp.LEASE_STATE_CANCELLED) and row["can"] == str(lp.CANCEL_REASON_STALE)
        assert len(await store.zmembers("pool")) == 2
        cmd = (await store.commands())[-1]
        assert sorted(cmd.cancel_leases.lease_ids) == sorted(le.lease_id for le in old)
        assert cmd.cancel_leases.reason == lp.CANCEL_REASON_STALE


class TestReap:
    async def reap(self, store, lease_ms=3_600_000, actor_ms=3_600_000):
        return await store.scripts.reap(lease_retention_ms=lease_ms, actor_retention_ms=actor_ms)

    async def test_expires_due_leases(self, store):
        await store.ready_job()
        a, b = await store.acquire(n=2)
        await store.redis.zadd(store.k("active"), {a.lease_id: 1})
        got = await self.reap(store)
        assert (got.expired, got.presumed_dead) == (1, 0)
        assert (await store.lease(a.lease_id))["st"] == str(lp.LEASE_STATE_EXPIRED)
        assert (await store.lease(b.lease_id))["st"] == str(lp.LEASE_STATE_ACTIVE)
        assert await store.zmembers("pool") == [f"{a.group_id}|{a.sample_index}"]

    async def test_presumes_silent_actors_dead_and_purges_departed_ones(self, store):
        await store.actor("quiet")
        await store.actor("gone")
        await store.actor("fresh")
        await store.redis.hset(store.k("a:quiet"), "hb", 0)
        await store.scripts.leave_actor("gone")
        await store.redis.hset(store.k("a:gone"), "hb", 0)
        got = await self.reap(store)
        assert got.presumed_dead == 1
        assert (await store.hash("a:quiet"))["live"] == str(lp.ACTOR_LIVENESS_DEAD)
        assert await store.redis.exists(store.k("a:gone")) == 0
        assert await store.redis.smembers(store.k("actors")) == {b"quiet", b"fresh"}

    async def test_purges_final_leases_and_ended_groups_after_their_retention(self, store):
        [gid] = await store.ready_job()
        a, b = await store.acquire(n=2)
        await store.submit(a, tid="ta")
        await store.submit(b, tid="tb")
        batch = (await store.scripts.get_batch(step=1, batch_size=2, floor=None, partial=False, evicted_before=0)).batch
        await store.scripts.ack_batch(step=1, batch_id=batch.batch_id)
        kept = await self.reap(store)
        assert kept.purged == 0 and await store.redis.exists(store.k("l:" + a.lease_id)) == 1
        await store.redis.zadd(store.k("ended"), {a.lease_id: 1, b.lease_id: 1})
        await store.redis.zadd(store.k("gended"), {gid: 1})
        got = await self.reap(store, lease_ms=1000)
        assert got.purged == 2
        assert await store.redis.exists(store.k("l:" + a.lease_id), store.k("vd:" + a.lease_id)) == 0
        assert await store.zmembers("leases") == [] and await store.hash("trj") == {}
        assert await store.redis.exists(store.k("g:" + gid)) == 0 and await store.redis.sismember(store.k("gdone"), gid)
