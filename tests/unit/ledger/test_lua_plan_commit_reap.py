"""plan_commit and reap, each run on its own against a real Redis."""

from __future__ import annotations

import asyncio

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

    async def test_a_tau_that_moved_since_the_plan_read_it_is_scaled_not_overwritten(self, store):
        await store.ready_job()
        for aid in ("kept", "moved", "decayed"):
            await store.actor(aid)
            await store.redis.hset(store.k("a:" + aid), "tau", "100")
        # settled work (or a heartbeat) moved two of them after the plan read 100
        await store.redis.hset(store.k("a:moved"), "tau", "120")
        await store.redis.hset(store.k("a:decayed"), "tau", "200")
        await plan_commit(store, taus={
            "kept": TauUpdate(100.0, 0, seen=100.0),  # unchanged: written as planned
            "moved": TauUpdate(100.0, 0, seen=100.0),  # the plan kept it: the newer 120 stays
            "decayed": TauUpdate(50.0, 3, seen=100.0),  # the plan halved it: the newer 200 is halved
        })  # fmt: skip
        taus = {aid: float((await store.hash("a:" + aid))["tau"]) for aid in ("kept", "moved", "decayed")}
        assert taus == {"kept": 100.0, "moved": 120.0, "decayed": 100.0}
        assert (await store.hash("a:decayed"))["excl"] == "3"

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

    # -- admitted samples whose reward never comes (the scorer died between Submit and RecordReward)

    async def test_an_unscored_sample_past_the_score_deadline_is_unadmitted_as_failed(self, store):
        await store.ready_job()
        a, b = await store.acquire(n=2)
        await store.submit(a, tid="ta", scored=False, generated_tokens=7)
        await store.submit(b, tid="tb")
        assert await store.zmembers("unscored") == ["ta"]
        assert (await store.group(a.group_id))["st"] == "C"  # complete, never ready: it waits for ta's reward
        kept = await store.scripts.reap(lease_retention_ms=3_600_000, actor_retention_ms=3_600_000,
                                        score_deadline_ms=60_000)
        assert kept.unscored_expired == 0 and await store.zmembers("unscored") == ["ta"]
        await asyncio.sleep(0.003)  # past a zero deadline is strictly older than now: not the same millisecond
        got = await store.scripts.reap(lease_retention_ms=3_600_000, actor_retention_ms=3_600_000,
                                       score_deadline_ms=0)  # every unscored sample is past a zero deadline
        assert got.unscored_expired == 1 and await store.zmembers("unscored") == []
        g = await store.group(a.group_id)
        assert g["st"] == "O" and g["adm"] == "1" and g["scd"] == "1" and g[f"s{a.sample_index}"] == "P"
        assert f"{a.group_id}|{a.sample_index}" in await store.zmembers("pool")
        assert await store.redis.exists(store.k("s:ta")) == 0 and (await store.hash("trj"))["ta"] == f"F:{a.lease_id}"
        stats = await store.hash("stats")
        assert (stats["score_expired"], stats["gen:failed:n"], stats["gen:failed:t"]) == ("1", "1", "7")
        assert await store.get("buf:n") == "1"
        # a late reward is neither recorded nor unknown, and counts nothing more
        late = await store.scripts.record_reward(trajectory_id="ta", failed=False, reward=1.0)
        assert (late.recorded, late.unknown_trajectory, late.group_ready) == (False, False, False)
        late_fail = await store.scripts.record_reward(trajectory_id="ta", failed=True, reward=0.0)
        assert not late_fail.recorded and (await store.hash("stats"))["gen:failed:n"] == "1"
        # the slot is leased again and the group completes and becomes ready
        [c] = await store.acquire()
        assert (c.group_id, c.sample_index) == (a.group_id, a.sample_index)
        assert (await store.submit(c, tid="tc")).admitted
        assert await store.zmembers("ready") == [a.group_id]

    async def test_the_index_holds_only_unscored_buffered_samples(self, store):
        await store.ready_job(groups=2)
        a, b, c, d = await store.acquire(n=4)
        await store.submit(a, tid="ta", scored=False)
        await store.submit(b, tid="tb", scored=False)
        await store.submit(c, tid="tc", scored=False)
        await store.submit(d, tid="td")
        await store.scripts.record_reward(trajectory_id="ta", failed=False, reward=0.5)
        await store.scripts.record_reward(trajectory_id="tb", failed=True, reward=0.0)
        assert await store.zmembers("unscored") == ["tc"]
        # the sample leaves the buffer another way (evicted as stale at GetBatch): it leaves the index with it
        await store.scripts.get_batch(step=1, batch_size=2, floor=2, partial=True, evicted_before=0)
        assert await store.redis.exists(store.k("s:tc")) == 0 and await store.zmembers("unscored") == []
        got = await store.scripts.reap(lease_retention_ms=3_600_000, actor_retention_ms=3_600_000,
                                       score_deadline_ms=0)
        assert got.unscored_expired == 0 and "score_expired" not in await store.hash("stats")
