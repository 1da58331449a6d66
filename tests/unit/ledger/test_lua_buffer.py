"""get_batch and ack_batch, each run on its own against a real Redis."""

from __future__ import annotations

import pytest

from rollart_ledger.errors import LedgerError


async def complete_groups(store, n: int, **policy) -> list[str]:
    """``n`` complete, scored groups of 2 in the buffer (admitted on version 0)."""
    gids = await store.ready_job(groups=n, **policy)
    for le in await store.acquire(n=2 * n):
        assert (await store.submit(le)).admitted
    return gids


async def attempt(store, step=1, batch_size=2, floor=None, partial=False, evicted_before=0):
    return await store.scripts.get_batch(
        step=step, batch_size=batch_size, floor=floor, partial=partial, evicted_before=evicted_before
    )


class TestGetBatch:
    async def test_not_enough_ready_samples_forms_nothing(self, store):
        await complete_groups(store, 1)
        got = await attempt(store, batch_size=3)
        assert got.batch is None and got.ready_samples == 2 and got.evicted_now == 0
        assert await store.zmembers("batches") == []

    async def test_takes_groups_oldest_first_and_reserves_them(self, store):
        first, second, _third = await complete_groups(store, 3)
        got = await attempt(store, step=4, batch_size=3, evicted_before=2)
        b = got.batch
        assert b.group_ids == [first, second] and b.samples == 4 and not b.partial
        assert (b.min_version, b.max_version, b.evicted) == (0, 0, 2) and b.batch_id.startswith("b4-")
        assert (await store.group(first))["st"] == "B"
        assert await store.get("buf:reserved") == "4" and await store.get("ready:n") == "2"
        assert len(await store.zmembers("buf:byver")) == 2  # reserved samples are not evicted
        again = await attempt(store, step=4, batch_size=3)
        assert again.batch == b  # the same batch until it is acknowledged

    async def test_partial_takes_what_is_ready(self, store):
        await complete_groups(store, 1)
        got = await attempt(store, batch_size=10, partial=True)
        assert got.batch.partial and got.batch.samples == 2

    async def test_evicts_samples_that_started_below_the_floor(self, store):
        [gid] = await complete_groups(store, 1)
        got = await attempt(store, batch_size=2, floor=1)
        assert got.batch is None and got.evicted_now == 2
        g = await store.group(gid)
        assert g["st"] == "O" and g["adm"] == "0" and (g["s0"], g["s1"]) == ("P", "P")
        assert len(await store.zmembers("pool")) == 2 and await store.get("buf:n") == "0"
        assert (await store.hash("stats"))["evicted"] == "2"

    async def test_an_acknowledged_step_is_refused(self, store):
        await complete_groups(store, 1)
        b = (await attempt(store)).batch
        await store.scripts.ack_batch(step=1, batch_id=b.batch_id)
        with pytest.raises(LedgerError) as exc:
            await attempt(store)
        assert exc.value.code == "FAILED_PRECONDITION"


class TestAckBatch:
    async def test_removes_the_samples_and_ends_the_groups_once(self, store):
        [gid] = await complete_groups(store, 1)
        b = (await attempt(store)).batch
        assert await store.scripts.ack_batch(step=1, batch_id=b.batch_id) == 2
        g = await store.group(gid)
        assert g["st"] == "K" and await store.redis.hexists(store.k("g:" + gid), "prompt") == 0
        assert (await store.get("buf:n"), await store.get("buf:reserved"), await store.get("inflight")) == ("0", "0", "0")
        assert set((await store.hash("trj")).values()) == {f"K:{lid}" for lid in ("L1", "L2")}
        assert gid in await store.zmembers("gended")
        assert await store.scripts.ack_batch(step=1, batch_id=b.batch_id) == 0

    async def test_unknown_step_or_another_batch_id_is_refused(self, store):
        await complete_groups(store, 1)
        b = (await attempt(store)).batch
        with pytest.raises(LedgerError) as exc:
            await store.scripts.ack_batch(step=2, batch_id=b.batch_id)
        assert exc.value.code == "NOT_FOUND"
        with pytest.raises(LedgerError) as exc:
            await store.scripts.ack_batch(step=1, batch_id="b1-999")
        assert exc.value.code == "FAILED_PRECONDITION"
        assert await store.get("buf:n") == "2"
