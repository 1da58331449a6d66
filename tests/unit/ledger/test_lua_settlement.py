"""submit and record_reward, each run on its own against a real Redis: the admission rules and the buffer they feed."""

from __future__ import annotations

import pytest

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart_ledger.errors import LedgerError
from rollart_ledger.scripts import WorkReport
from tests.integration.ledger.helpers import h

R = lp.RejectionReason


def slot(lease: lp.Lease) -> str:
    return f"{lease.group_id}|{lease.sample_index}"


class TestSubmitAdmits:
    async def test_an_admitted_sample_enters_the_buffer(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        got = await store.submit(le, tid="t1", reward=0.5)
        assert got.admitted and got.reason == 0 and not got.duplicate and not got.awaiting_reward
        assert got.group_admitted == 1 and not got.group_complete
        assert got.lease.state == lp.LEASE_STATE_SETTLED and got.lease.trajectory_id == "t1"
        s = await store.hash("s:t1")
        assert (s["gid"], s["idx"], s["ver"], s["lv"], s["rw"], s["scd"], s["res"]) == (
            le.group_id, str(le.sample_index), "0", "0", "0.5", "1", "0"
        )  # fmt: skip
        assert (await store.group(le.group_id))[f"s{le.sample_index}"] == "D:t1"
        assert await store.hash("trj") == {"t1": f"B:{le.lease_id}"}
        assert (await store.get("buf:n"), await store.get("buf:scored")) == ("1", "1")
        assert (await store.hash("stats"))["admitted"] == "1"
        assert await store.redis.llen(store.k("ct")) == 1  # completion time, for the adaptive TTL

    async def test_a_second_submission_returns_the_first_verdict_counted_once(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        first = await store.submit(le, tid="t1")
        again = await store.submit(le, tid="t1")
        assert again.duplicate and again.admitted == first.admitted and again.detail == first.detail
        assert again.group_admitted == first.group_admitted
        stats = await store.hash("stats")
        assert stats["admitted"] == "1" and stats["dup"] == "1"
        assert await store.get("buf:n") == "1"

    async def test_a_complete_group_cancels_its_other_leases_and_is_ready(self, store):
        await store.ready_job(redundancy=1)
        await store.prompts(1, prefix="q", redundancy=1, group_ids=["g"])
        a, b, c = await store.acquire(group_id="g", n=3)
        await store.submit(a)
        got = await store.submit(b)
        assert got.group_complete and got.group_admitted == 2
        assert (await store.lease(c.lease_id))["can"] == str(lp.CANCEL_REASON_GROUP_COMPLETE)
        g = await store.group("g")
        assert g["st"] == "C" and g[f"s{c.sample_index}"] == "X"
        assert await store.zmembers("ready") == ["g"] and await store.get("ready:n") == "2"
        assert b"g" not in await store.redis.smembers(store.k("gopen"))
        cmd = (await store.commands())[-1]
        assert list(cmd.cancel_leases.lease_ids) == [c.lease_id] and cmd.target == "env-1"

    async def test_an_unscored_sample_awaits_its_reward(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        got = await store.submit(le, scored=False)
        assert got.admitted and got.awaiting_reward
        assert await store.get("buf:scored") is None

    async def test_settled_work_feeds_the_actors_settled_tokens(self, store):
        await store.ready_job()
        await store.actor("a1")
        [le] = await store.acquire()
        await store.submit(le, work=[WorkReport("a1", 120, 50), WorkReport("ghost", 5, 5)])
        a = await store.hash("a:a1")
        assert a["tok"] == "120" and a["wt"] == "120"  # summed until the tau window is over
        assert await store.redis.exists(store.k("a:ghost")) == 0


class TestSubmitRejects:
    async def rejected(self, store, le, reason, **kw):
        got = await store.submit(le, **kw)
        assert not got.admitted and got.reason == reason, got.detail
        return got

    async def test_unknown_lease(self, store):
        await store.ready_job()
        got = await store.scripts.submit(
            lease_id="L404", trajectory_id="t", holder="env-1", lease_version=0, ok=True, token_versions=(0, 0),
            scored=True, reward=1.0, trajectory=b"", tau_window_ms=5000, version_hashes={0: h(0)}, work=(),
        )  # fmt: skip
        assert got.reason == R.REJECTION_REASON_UNKNOWN_LEASE and got.lease is None

    async def test_wrong_holder_changes_nothing(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        le.holder = "env-2"
        await self.rejected(store, le, R.REJECTION_REASON_WRONG_HOLDER)
        assert (await store.lease(le.lease_id))["st"] == str(lp.LEASE_STATE_ACTIVE)

    async def test_a_trajectory_id_of_another_lease_is_refused(self, store):
        await store.ready_job()
        a, b = await store.acquire(n=2)
        await store.submit(a, tid="t1")
        with pytest.raises(LedgerError) as exc:
            await store.submit(b, tid="t1")
        assert exc.value.code == "ALREADY_EXISTS"
        assert (await store.lease(b.lease_id))["st"] == str(lp.LEASE_STATE_ACTIVE)

    async def test_a_rejected_lease_returns_its_sample_to_the_pool(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        await self.rejected(store, le, R.REJECTION_REASON_HASH_MISMATCH, version_hashes={0: h(7)})
        row = await store.lease(le.lease_id)
        assert row["st"] == str(lp.LEASE_STATE_REJECTED) and row["rej"] == str(R.REJECTION_REASON_HASH_MISMATCH)
        assert slot(le) in await store.zmembers("pool")
        assert (await store.hash("trj"))[f"t-{le.lease_id}"] == f"R:{le.lease_id}"
        assert (await store.hash("stats"))[f"rej:{R.REJECTION_REASON_HASH_MISMATCH}"] == "1"
        # settled once: a second result for the lease is ALREADY_SETTLED
        await self.rejected(store, le, R.REJECTION_REASON_ALREADY_SETTLED, tid="other")

    async def test_unregistered_version(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        await self.rejected(store, le, R.REJECTION_REASON_UNKNOWN_VERSION, version_hashes={0: h(0), 3: h(3)})

    async def test_a_trajectory_that_did_not_end_normally(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        await self.rejected(store, le, R.REJECTION_REASON_FAILED, ok=False)

    async def test_after_the_lease_expired(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        await store.redis.hset(store.k("l:" + le.lease_id), "exp", 1)
        got = await self.rejected(store, le, R.REJECTION_REASON_EXPIRED)
        assert got.lease.state == lp.LEASE_STATE_EXPIRED

    async def test_a_cancelled_lease(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        await store.scripts.cancel(reason=lp.CANCEL_REASON_MANUAL, lease_ids=[le.lease_id], group_ids=[])
        await self.rejected(store, le, R.REJECTION_REASON_CANCELLED)

    async def test_strict_admits_only_tokens_on_the_lease_version(self, store):
        await store.ready_job(admission=common_pb2.ADMISSION_POLICY_STRICT, alpha=1)
        await store.version(1)
        a, b = await store.acquire(n=2)  # v_j = 1
        hashes = {0: h(0), 1: h(1)}
        await self.rejected(store, a, R.REJECTION_REASON_STALE, token_versions=(0, 1), version_hashes=hashes)
        await self.rejected(store, b, R.REJECTION_REASON_STALE, lease_version=0)

    async def test_bounded_rejects_a_start_below_n_minus_alpha(self, store):
        await store.ready_job(alpha=1)
        for v in (1, 2):
            await store.version(v)
        a, b = await store.acquire(n=2)
        await store.redis.hset(store.k("cur"), mapping={"step": 1, "v": 2, "B": 2})
        # tokens from 1 (= n - alpha) on are admissible; 0 is too old
        assert (await store.submit(a, token_versions=(1, 2), version_hashes={1: h(1), 2: h(2)})).admitted
        await self.rejected(store, b, R.REJECTION_REASON_STALE, token_versions=(0, 2), version_hashes={0: h(0), 2: h(2)})


class TestRecordReward:
    async def test_scores_a_waiting_sample_once_and_the_group_becomes_ready(self, store):
        await store.ready_job()
        a, b = await store.acquire(n=2)
        await store.submit(a, tid="ta", scored=False)
        await store.submit(b, tid="tb")
        first = await store.scripts.record_reward(trajectory_id="ta", failed=False, reward=0.25)
        assert first.recorded and first.reward == 0.25 and first.group_ready and not first.unknown_trajectory
        assert await store.zmembers("ready") == [a.group_id]
        again = await store.scripts.record_reward(trajectory_id="ta", failed=False, reward=0.9)
        assert not again.recorded and again.reward == 0.25
        assert (await store.hash("s:ta"))["rw"] == "0.25"

    async def test_failed_scoring_removes_the_sample_and_reopens_its_group(self, store):
        await store.ready_job()
        a, b = await store.acquire(n=2)
        await store.submit(a, tid="ta", scored=False)
        await store.submit(b, tid="tb")
        got = await store.scripts.record_reward(trajectory_id="ta", failed=True, reward=0.0)
        assert got.recorded
        g = await store.group(a.group_id)
        assert g["st"] == "O" and g["adm"] == "1" and g[f"s{a.sample_index}"] == "P"
        assert slot(a) in await store.zmembers("pool")
        assert await store.redis.exists(store.k("s:ta")) == 0
        assert (await store.hash("trj"))["ta"] == f"F:{a.lease_id}"
        assert await store.get("buf:n") == "1" and (await store.hash("stats"))["reward_failed"] == "1"

    async def test_unknown_and_rejected_trajectories_are_unknown(self, store):
        await store.ready_job()
        [le] = await store.acquire()
        await store.submit(le, tid="tr", ok=False)
        for tid in ("nope", "tr"):
            got = await store.scripts.record_reward(trajectory_id=tid, failed=False, reward=1.0)
            assert got.unknown_trajectory and not got.recorded
