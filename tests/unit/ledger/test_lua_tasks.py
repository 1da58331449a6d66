"""Multi-task jobs in the store (issue 12): batches filled by task share in whole groups, each task's share
of the in-flight capacity, per-task in-flight counters, the per-task pools of GetStatus, bad shares."""

from __future__ import annotations

import itertools

import pytest

from rollart.v1 import ledger_pb2 as lp
from rollart_ledger import policy as pol
from rollart_ledger.tasks import task_pools


async def multitask_job(store, shares: dict[str, float], groups: dict[str, int], **policy) -> dict[str, list[str]]:
    """Policy with ``shares``, version 0, and ``groups[task]`` groups of 2 of each task (added task by task)."""
    await store.policy(task_shares=shares, **policy)
    await store.version(0)
    return {t: await store.prompts(n, task=t, prefix=f"{t}-") for t, n in groups.items()}


async def complete(store, task: str, n_leases: int) -> None:
    for le in await store.acquire(holder=f"env-{task}", n=n_leases, tasks=(task,)):
        assert (await store.submit(le)).admitted


async def attempt(store, step=1, batch_size=4, partial=False):
    return await store.scripts.get_batch(step=step, batch_size=batch_size, floor=None, partial=partial, evicted_before=0)


class TestQuotas:
    def test_largest_remainder_in_whole_groups(self):
        assert pol.task_group_quotas(4, {"a": 0.5, "b": 0.5}) == {"a": 2, "b": 2}
        assert pol.task_group_quotas(4, {"a": 0.75, "b": 0.25}) == {"a": 3, "b": 1}
        assert pol.task_group_quotas(3, {"a": 0.5, "b": 0.5}) == {"a": 2, "b": 1}  # tie: by task tag
        assert pol.task_group_quotas(5, {"a": 1, "b": 1, "c": 1}) == {"a": 2, "b": 2, "c": 1}
        assert pol.task_group_quotas(2, {"a": 1.0, "b": 0.0}) == {"a": 2, "b": 0}
        for groups, raw in itertools.product(range(0, 9), ([1, 1], [3, 1], [1, 2, 3], [0.1, 0.2, 0.7])):
            q = pol.task_group_quotas(groups, dict(zip("abc", raw)))
            assert sum(q.values()) == groups and min(q.values()) >= 0

    @pytest.mark.parametrize(
        "shares,groups", [({"a": 1, "b": 1}, 3), ({"a": 3, "b": 1}, 4), ({"a": 1, "b": 2, "c": 3}, 5)]
    )
    async def test_get_batch_applies_the_same_rule(self, store, shares, groups):
        ready = await multitask_job(store, shares, dict.fromkeys(shares, groups))
        for t in shares:
            await complete(store, t, 2 * groups)
        got = (await attempt(store, batch_size=2 * groups)).batch
        assert got is not None
        tasks = [g.split("-")[0] for g in got.group_ids]
        want = pol.task_group_quotas(groups, pol.task_shares(await store.policy(task_shares=shares)))
        assert {t: tasks.count(t) for t in want if want[t]} == {t: n for t, n in want.items() if n}
        assert all(g in ready[g.split("-")[0]] for g in got.group_ids)


class TestBatchByShare:
    async def test_waits_for_every_task_then_takes_each_share_oldest_first(self, store):
        groups = await multitask_job(store, {"a": 1, "b": 1}, {"a": 3, "b": 2})
        await complete(store, "a", 6)  # three complete groups of a: enough samples, but no b
        got = await attempt(store, batch_size=4)
        assert got.batch is None and got.ready_samples < 4
        await complete(store, "b", 2)
        b = (await attempt(store, batch_size=4)).batch
        assert b.group_ids == [groups["a"][0], groups["b"][0]] and b.samples == 4 and not b.partial
        assert await store.get("inflight:t:a") == "4" and await store.get("inflight:t:b") == "0"

    async def test_partial_at_the_end_of_the_wait_takes_what_there_is(self, store):
        groups = await multitask_job(store, {"a": 1, "b": 1}, {"a": 2, "b": 1})
        await complete(store, "a", 4)
        b = (await attempt(store, batch_size=4, partial=True)).batch
        assert b.partial and b.group_ids == [groups["a"][0]] and b.samples == 2

    async def test_one_task_jobs_keep_taking_the_oldest_groups(self, store):
        await store.policy()
        await store.version(0)
        a = await store.prompts(2, task="a", prefix="a-")
        b = await store.prompts(1, task="b", prefix="b-")
        for le in await store.acquire(n=6):
            assert (await store.submit(le)).admitted
        got = (await attempt(store, batch_size=4)).batch
        assert got.group_ids == a and b[0] not in got.group_ids


class TestBackPressure:
    async def test_each_task_gets_its_share_of_the_capacity(self, store):
        await multitask_job(store, {"a": 3, "b": 1}, {"a": 3, "b": 3}, buffer_capacity=4)
        got_a = await store.acquire(holder="env-a", n=10, tasks=("a",))
        assert len(got_a) == 2  # cap_a = round(4 * 3/4) = 3: one group of 2, not two
        got_b = await store.acquire(holder="env-b", n=10, tasks=("b",))
        assert len(got_b) == 2  # b still starts its group (without shares a would have taken all 4)
        assert (await store.get("inflight:t:a"), await store.get("inflight:t:b")) == ("2", "2")

    async def test_without_shares_one_task_can_take_the_whole_capacity(self, store):
        await store.policy(buffer_capacity=4)
        await store.version(0)
        await store.prompts(3, task="a", prefix="a-")
        await store.prompts(3, task="b", prefix="b-")
        assert len(await store.acquire(holder="env-a", n=10, tasks=("a",))) == 4
        assert await store.acquire(holder="env-b", n=10, tasks=("b",)) == []

    async def test_ack_and_drop_release_the_task_count(self, store):
        await multitask_job(store, {"a": 1, "b": 1}, {"a": 1, "b": 1})
        await complete(store, "a", 2)
        await complete(store, "b", 2)
        b = (await attempt(store, batch_size=4)).batch
        await store.scripts.ack_batch(step=1, batch_id=b.batch_id)
        assert (await store.get("inflight:t:a"), await store.get("inflight:t:b")) == ("0", "0")


class TestStatusAndBadShares:
    async def test_task_pools(self, store):
        await multitask_job(store, {"a": 3, "b": 1}, {"a": 2, "b": 1})
        await complete(store, "a", 2)
        policy = await store.policy(task_shares={"a": 3, "b": 1})
        pools = {p.task: p for p in await task_pools(store.redis, store.prefix, policy)}
        assert set(pools) == {"a", "b"}
        assert pools["a"].share == 0.75 and pools["a"].ready_groups == 1 and pools["a"].pending_slots == 2
        assert pools["a"].inflight_samples == 2 and pools["b"].pending_slots == 2 and pools["b"].ready_groups == 0

    @pytest.mark.parametrize(
        "shares,field",
        [
            ({"a": -1.0, "b": 2.0}, "task_shares[a]"),
            ({"a": 0.0, "b": 0.0}, "sum to a positive number"),
            ({"a": float("nan")}, "task_shares[a]"),
            ({"a": float("inf")}, "task_shares[a]"),
            ({"": 1.0}, "task tag"),
            ({"a b": 1.0}, "task tag"),
            ({"x" * 200: 1.0}, "task tag"),
            ({f"t{i}": 1.0 for i in range(65)}, "at most 64"),
        ],
    )
    def test_refused_with_the_field_named(self, shares, field):
        with pytest.raises(pol.PolicyError, match="policy.task_shares") as exc:
            pol.fill(lp.JobPolicy(job_id="job-1", task_shares=shares), "")
        assert field in str(exc.value)
