"""list_unscored against a real Redis: the admitted samples a restarted envmanager must still score (its previous
process was killed between Submit and RecordReward), and the one reward that then counts."""

from __future__ import annotations

import asyncio

import pytest

from rollart.runtime import errors
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart_ledger import validators


def blob(tid: str) -> bytes:
    return common_pb2.Trajectory(trajectory_id=tid, status=common_pb2.TRAJECTORY_STATUS_OK).SerializeToString()


async def listed(store, prefix: str = "", n: int = 100) -> list[str]:
    page = await store.scripts.list_unscored(holder_prefix=prefix, max_samples=n)
    return [u.trajectory_id for u in page.samples]


class TestListUnscored:
    async def test_lists_the_unscored_samples_of_the_holders_under_the_prefix_oldest_first(self, store):
        await store.ready_job(groups=3)
        [a] = await store.acquire(holder="em-1/g/0")
        [b] = await store.acquire(holder="em-1/g/1")
        [c] = await store.acquire(holder="em-1/g/2")
        [d] = await store.acquire(holder="em-10/g/0")  # another envmanager whose id starts the same way
        [e] = await store.acquire(holder="em-1/g/3")
        await store.submit(b, tid="tb", scored=False, trajectory=blob("tb"))
        await asyncio.sleep(0.005)  # admitted a few ms later (in one ms, ties go by trajectory id)
        await store.submit(a, tid="ta", scored=False, trajectory=blob("ta"))
        await store.submit(c, tid="tc")  # scored at settlement
        await store.submit(d, tid="td", scored=False)
        await store.submit(e, tid="te", ok=False)  # rejected
        page = await store.scripts.list_unscored(holder_prefix="em-1/", max_samples=100)
        assert [u.trajectory_id for u in page.samples] == ["tb", "ta"] and page.after is None
        u = page.samples[0]
        assert u.lease.lease_id == b.lease_id and u.lease.state == lp.LEASE_STATE_SETTLED
        assert u.lease.trajectory_id == "tb" and u.lease.holder == "em-1/g/1" and u.lease.prompt.prompt_id
        assert common_pb2.Trajectory.FromString(u.trajectory).trajectory_id == "tb"
        assert u.admitted_ms > 0
        assert await listed(store) == ["tb", "ta", "td"]  # empty prefix: any holder
        assert await listed(store, n=1) == ["tb"]
        assert await listed(store, "em-2/") == []

    async def test_a_scored_failed_or_reaped_sample_is_no_longer_listed(self, store):
        await store.ready_job(groups=2)
        a, b, c, d = await store.acquire(holder="em/0", n=4)
        for le, tid in zip((a, b, c, d), ("ta", "tb", "tc", "td")):
            await store.submit(le, tid=tid, scored=False)
        await store.scripts.record_reward(trajectory_id="ta", failed=False, reward=0.5)
        await store.scripts.record_reward(trajectory_id="tb", failed=True, reward=0.0)
        assert await listed(store, "em/") == ["tc", "td"]
        await asyncio.sleep(0.005)  # past a zero deadline (admitted strictly before now)
        await store.scripts.reap(lease_retention_ms=3_600_000, actor_retention_ms=3_600_000, score_deadline_ms=0)
        assert await listed(store, "em/") == []

    async def test_the_restarted_score_counts_once_and_the_old_process_late_score_is_ignored(self, store):
        await store.ready_job()
        a, b = await store.acquire(holder="em/0", n=2)
        await store.submit(a, tid="ta", scored=False)
        await store.submit(b, tid="tb")
        assert await store.zmembers("ready") == []  # the group waits for ta's reward
        [u] = (await store.scripts.list_unscored(holder_prefix="em/", max_samples=10)).samples
        first = await store.scripts.record_reward(trajectory_id=u.trajectory_id, failed=False, reward=0.75)
        assert first.recorded and first.group_ready
        late = await store.scripts.record_reward(trajectory_id="ta", failed=False, reward=0.1)  # the old process
        late_fail = await store.scripts.record_reward(trajectory_id="ta", failed=True, reward=0.0)
        assert not late.recorded and late.reward == 0.75 and not late_fail.recorded
        assert await store.get("buf:scored") == "2" and await store.get("buf:n") == "2"
        assert (await store.group(a.group_id))["scd"] == "2" and await store.get("ready:n") == "2"
        assert await store.zmembers("ready") == [a.group_id] and "reward_failed" not in await store.hash("stats")
        assert await listed(store, "em/") == []

    async def test_pages_by_count_and_bytes_go_through_every_sample_once(self, store):
        await store.ready_job(groups=3)
        leases = await store.acquire(holder="em/0", n=6)
        tids = [f"t{i}" for i in range(6)]
        for le, tid in zip(leases, tids):
            await store.submit(le, tid=tid, scored=False, trajectory=blob(tid))  # several in one ms: ties by id
        order = await store.zmembers("unscored")
        assert sorted(order) == tids
        for kw in ({"max_samples": 4}, {"max_samples": 1}, {"max_samples": 100, "max_bytes": 1}):
            seen, after, pages = [], None, 0
            while True:
                page = await store.scripts.list_unscored(holder_prefix="em/", after=after, **kw)
                seen += [u.trajectory_id for u in page.samples]
                pages += 1
                if page.after is None:
                    break
                after = page.after
            assert seen == order and pages >= 2, kw  # the index's order, each once
        # a page after the last sample is empty and the last
        last = await store.scripts.list_unscored(holder_prefix="em/", max_samples=6)
        assert last.after is None and len(last.samples) == 6


def test_the_request_is_checked():
    assert validators.list_unscored(lp.ListUnscoredRequest()) == (100, None)
    got = validators.list_unscored(
        lp.ListUnscoredRequest(holder_prefix="em-1/g/", max_samples=1000, page_token="17:t-1")
    )
    assert got == (1000, (17, "t-1"))
    for bad in (
        lp.ListUnscoredRequest(max_samples=1001),
        lp.ListUnscoredRequest(max_samples=-1),
        lp.ListUnscoredRequest(holder_prefix="/bad prefix"),
        lp.ListUnscoredRequest(page_token="17"),
        lp.ListUnscoredRequest(page_token="x:t-1"),
    ):
        with pytest.raises(errors.InvalidArgument):
            validators.list_unscored(bad)
