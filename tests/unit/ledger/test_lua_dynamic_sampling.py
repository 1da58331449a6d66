"""get_batch.lua's dynamic sampling (issue 25 item 4), run on its own against a real Redis: zero-variance groups
consumed as ``filtered`` (never trained, never leased again), the batch filled from further groups, the bound on
groups drawn, the step's filtering kept across attempts and never repeated by a retry."""

from __future__ import annotations

from rollart_ledger import codec

TOK = 7  # generated tokens each sample reports


async def complete(store, rewards: dict[str, tuple[float, float]]) -> None:
    """Every pooled slot of the groups in ``rewards`` leased and admitted with its group's rewards, in order."""
    leases = await store.acquire(n=2 * len(rewards))
    assert len(leases) == 2 * len(rewards)
    for le in leases:
        r = rewards[le.group_id][le.sample_index]
        assert (await store.submit(le, reward=r, generated_tokens=TOK)).admitted


async def attempt(store, step=1, batch_size=4, drop=True, max_groups=0, partial=False):
    return await store.scripts.get_batch(
        step=step, batch_size=batch_size, floor=None, partial=partial, evicted_before=0,
        drop_zero_variance=drop, max_groups=max_groups,
    )  # fmt: skip


async def accounting(store):
    return codec.accounting({k: int(v) for k, v in (await store.hash("stats")).items() if k.startswith("gen:")})


async def assert_filtered(store, gid: str) -> None:
    g = await store.group(gid)
    assert g["st"] == "Z" and gid in await store.zmembers("gended") and gid not in await store.zmembers("ready")
    for slot in ("s0", "s1"):
        tid = g[slot][2:]
        assert await store.redis.exists(store.k("s:" + tid)) == 0
        assert (await store.hash("trj"))[tid].startswith("Z:")


class TestFilter:
    async def test_all_equal_groups_are_filtered_counted_and_the_batch_filled_from_further_groups(self, store):
        g = await store.ready_job(groups=5)
        await complete(store, {g[0]: (1, 1), g[1]: (0, 1), g[2]: (0, 0), g[3]: (0.5, 0.25), g[4]: (1, 0)})
        b = (await attempt(store)).batch
        assert b.group_ids == [g[1], g[3]] and b.samples == 4 and not b.partial
        assert (b.filtered_groups, b.filtered_samples, b.filtered_tokens) == (2, 4, 4 * TOK)
        for gid in (g[0], g[2]):
            await assert_filtered(store, gid)
        acc = await accounting(store)
        assert (acc.filtered.samples, acc.filtered.tokens, acc.trained.samples) == (4, 4 * TOK, 0)
        # the buffer holds the batch (reserved) and the group not drawn; in flight: only the undrawn group
        buf = [await store.get(name) for name in ("buf:n", "buf:reserved", "ready:n")]
        assert buf == ["6", "4", "2"]
        assert await store.get("inflight") == "2"
        # acknowledged: the batch's samples are trained, the filtered ones stay filtered
        assert await store.scripts.ack_batch(step=1, batch_id=b.batch_id) == 4
        acc = await accounting(store)
        assert (acc.trained.samples, acc.filtered.samples) == (4, 4)
        assert acc.wasted_token_fraction == 0.5  # filtered tokens were generated and not trained

    async def test_filtered_groups_are_never_leased_again(self, store):
        g = await store.ready_job(groups=2)
        await complete(store, {g[0]: (1, 1), g[1]: (0, 1)})
        await attempt(store, batch_size=2)
        assert await store.zmembers("pool") == [] and await store.acquire(n=10) == []
        # a late duplicate of a filtered trajectory's reward is not recorded
        tid = (await store.group(g[0]))["s0"][2:]
        assert not (await store.scripts.record_reward(trajectory_id=tid, failed=False, reward=0.0)).recorded

    async def test_without_the_flag_zero_variance_groups_are_batched_as_before(self, store):
        g = await store.ready_job(groups=2)
        await complete(store, {g[0]: (1, 1), g[1]: (0, 0)})
        b = (await attempt(store, drop=False)).batch
        assert b.group_ids == [g[0], g[1]] and b.filtered_groups == 0
        assert (await accounting(store)).filtered.samples == 0

    async def test_rewards_that_differ_in_the_last_bit_are_not_filtered(self, store):
        g = await store.ready_job(groups=1)
        await complete(store, {g[0]: (0.1, 0.1 + 2**-56)})  # repr round-trips: compared as the same doubles
        b = (await attempt(store, batch_size=2)).batch
        assert b.group_ids == [g[0]] and b.filtered_groups == 0


class TestAttemptsAndRetries:
    async def test_filtering_persists_across_attempts_and_a_retry_repeats_nothing(self, store):
        g = await store.ready_job(groups=4)
        await complete(store, {g[0]: (1, 1), g[1]: (0, 1)})
        first = await attempt(store)
        assert first.batch is None and first.filtered_now == 1 and first.ready_samples == 2
        await complete(store, {g[2]: (1, 0)})
        b = (await attempt(store)).batch
        assert b.group_ids == [g[1], g[2]] and (b.filtered_groups, b.filtered_samples) == (1, 2)
        assert await store.redis.exists(store.k("bfilt:1")) == 0  # moved into the batch
        await complete(store, {g[3]: (0, 0)})  # a zero-variance group ready after the batch formed
        again = await attempt(store)
        assert again.batch == b and again.filtered_now == 0
        assert (await store.group(g[3]))["st"] == "C"  # the retry filtered nothing more
        assert (await accounting(store)).filtered.samples == 2

    async def test_a_group_is_filtered_only_while_the_bound_leaves_room_for_the_batch(self, store):
        g = await store.ready_job(groups=4)
        await complete(store, {g[0]: (1, 1), g[1]: (0, 0), g[2]: (0, 1), g[3]: (1, 0)})
        # bound 3, batch of 2 groups: g0 filtered (1 drawn + 2 needed = 3); g1 would leave no room: kept
        b = (await attempt(store, max_groups=3)).batch
        assert b.group_ids == [g[1], g[2]] and not b.partial and b.filtered_groups == 1
        await assert_filtered(store, g[0])
        assert (await store.group(g[3]))["st"] == "C"  # not drawn

    async def test_the_bound_counts_groups_filtered_by_earlier_attempts(self, store):
        g = await store.ready_job(groups=4)
        await complete(store, {g[0]: (1, 1)})
        assert (await attempt(store, max_groups=3)).filtered_now == 1
        await complete(store, {g[1]: (0, 0), g[2]: (0, 1), g[3]: (1, 1)})
        # alone, g1 would be filtered (1 + 2 needed <= 3); after g0, it is kept (zero advantage)
        b = (await attempt(store, max_groups=3)).batch
        assert b.group_ids == [g[1], g[2]] and b.filtered_groups == 1 and b.filtered_samples == 2

    async def test_a_bound_below_the_batch_filters_nothing(self, store):
        g = await store.ready_job(groups=2)
        await complete(store, {g[0]: (1, 1), g[1]: (0, 0)})
        b = (await attempt(store, max_groups=1)).batch
        assert b.group_ids == [g[0], g[1]] and b.filtered_groups == 0

    async def test_partial_at_the_end_of_the_wait_keeps_the_filter(self, store):
        g = await store.ready_job(groups=2)
        await complete(store, {g[0]: (1, 1), g[1]: (0, 1)})
        b = (await attempt(store, batch_size=10, partial=True)).batch
        assert b.partial and b.group_ids == [g[1]] and b.filtered_groups == 1

    async def test_only_zero_variance_groups_and_partial_forms_no_empty_batch(self, store):
        g = await store.ready_job(groups=1)
        await complete(store, {g[0]: (1, 1)})
        got = await attempt(store, batch_size=10, partial=True)
        assert got.batch is None and got.filtered_now == 1
        assert await store.zmembers("batches") == []


class TestMultiTask:
    async def test_each_task_fills_its_share_from_further_groups(self, store):
        await store.policy(task_shares={"a": 1, "b": 1})
        await store.version(0)
        a = await store.prompts(2, task="a", prefix="a-")
        b = await store.prompts(1, task="b", prefix="b-")
        await complete(store, {a[0]: (1, 1), a[1]: (0, 1), b[0]: (1, 0)})
        got = (await attempt(store)).batch
        assert sorted(got.group_ids) == sorted([a[1], b[0]]) and got.filtered_groups == 1
        await assert_filtered(store, a[0])
        assert await store.get("inflight:t:a") == "0" and await store.get("inflight:t:b") == "0"
