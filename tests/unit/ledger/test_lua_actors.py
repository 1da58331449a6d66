"""register_actor, heartbeat, leave_actor and ack_command, each run on its own against a real Redis."""

from __future__ import annotations

import pytest

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart_ledger.errors import LedgerError
from tests.integration.ledger.helpers import weights

ALIVE, DRAINING, DEAD, LEFT = (
    lp.ACTOR_LIVENESS_ALIVE,
    lp.ACTOR_LIVENESS_DRAINING,
    lp.ACTOR_LIVENESS_DEAD,
    lp.ACTOR_LIVENESS_LEFT,
)


async def beat(store, aid="a1", tps=0.0, **kw):
    kw.setdefault("weights", None)
    kw.setdefault("in_flight_requests", 0)
    kw.setdefault("draining", False)
    kw.setdefault("relay_id", "")
    return await store.scripts.heartbeat(actor_id=aid, observed_tokens_per_s=tps, **kw)


class TestRegisterActor:
    async def test_a_new_actor_is_alive_with_the_initial_tau(self, store):
        h = await store.actor("a1", active=3, region="eu", relay_id="r1")
        assert lp.LedgerActor.FromString(h["info"]).actor_id == "a1"
        assert common_pb2.ActorWeightState.FromString(h["w"]).active_version == 3
        assert float(h["tau"]) == 1000.0 and h["live"] == str(ALIVE).encode() and h["obs"] == b"0"
        assert h["region"] == b"eu" and h["relay"] == b"r1"
        assert await store.redis.smembers(store.k("actors")) == {b"a1"}

    async def test_registering_again_keeps_tau_and_revives(self, store):
        await store.actor("a1")
        await store.redis.hset(store.k("a:a1"), mapping={"tau": "42", "live": DEAD, "tok": 7})
        h = await store.actor("a1", active=1)
        assert float(h["tau"]) == 42.0 and h["tok"] == b"7"
        assert h["live"] == str(ALIVE).encode()


class TestHeartbeat:
    async def test_an_unknown_actor_is_told_so_and_nothing_is_written(self, store):
        got = await beat(store, "ghost", tps=10)
        assert got.status == "unknown"
        assert await store.redis.exists(store.k("a:ghost")) == 0

    async def test_a_departed_actor_is_not_revived(self, store):
        await store.actor("a1")
        await store.scripts.leave_actor("a1")
        assert (await beat(store)).status == "unknown"
        assert (await store.hash("a:a1"))["live"] == str(LEFT)

    async def test_throughput_feeds_tau_first_replacing_then_blending(self, store):
        await store.actor("a1")
        first = await beat(store, tps=500.0)
        assert first.status == "ok" and first.tau == 500.0  # the first observation replaces initial_tau
        second = await beat(store, tps=1500.0)
        assert second.tau == pytest.approx(0.7 * 500 + 0.3 * 1500)  # EMA with tau_ema_weight 0.3
        kept = await beat(store, tps=0.0)
        assert kept.tau == pytest.approx(second.tau)  # no observation: tau unchanged
        assert (await store.hash("a:a1"))["obs"] == "2"

    async def test_reports_state_and_keeps_what_is_not_reported(self, store):
        await store.actor("a1", relay_id="r1")
        await beat(store, weights=weights(2), in_flight_requests=3, draining=True)
        a = await store.hash("a:a1")
        assert a["live"] == str(DRAINING) and a["infl"] == "3" and a["relay"] == "r1"
        await beat(store, relay_id="r2")
        a = await store.redis.hgetall(store.k("a:a1"))
        assert a[b"live"] == str(ALIVE).encode() and a[b"relay"] == b"r2"
        assert common_pb2.ActorWeightState.FromString(a[b"w"]).active_version == 2  # None kept the weights

    async def test_returns_the_latest_command_sequence_addressed_to_it(self, store):
        await store.actor("a1")
        await store.version(0)  # broadcast to actors: sequence 1
        assert (await beat(store)).latest_command_sequence == 1

    async def test_a_silent_actor_is_presumed_dead_and_its_leases_return(self, store):
        await store.ready_job()
        await store.actor("a1")
        [lease] = await store.acquire(holder="a1")
        await store.redis.hset(store.k("a:a1"), "hb", 0)
        got = await beat(store)
        assert got.status == "dead"
        assert (await store.hash("a:a1"))["live"] == str(DEAD)
        le = await store.lease(lease.lease_id)
        assert le["st"] == str(lp.LEASE_STATE_RELEASED) and le["rel"] == str(lp.RELEASE_REASON_INFRA_FAILURE)
        assert f"{lease.group_id}|{lease.sample_index}" in await store.zmembers("pool")


class TestActorEpoch:
    """P aepoch, what PlanStep watches instead of every actor's hash: it moves with what a plan is made of."""

    async def epoch(self, store) -> int:
        return int(await store.get("aepoch") or 0)

    async def test_plain_heartbeats_and_tau_do_not_move_it(self, store):
        await store.actor("a1", relay_id="r1")
        e = await self.epoch(store)
        for tps in (0.0, 500.0, 900.0):
            await beat(store, tps=tps, weights=weights(0), relay_id="r1", in_flight_requests=int(tps))
        await beat(store)  # nothing reported: kept
        assert await self.epoch(store) == e

    @pytest.mark.parametrize("change", [
        {"weights": weights(1)}, {"weights": weights(0, (1,))}, {"draining": True}, {"relay_id": "r2"},
    ])  # fmt: skip
    async def test_weights_draining_and_relay_changes_move_it(self, store, change):
        await store.actor("a1", relay_id="r1")
        e = await self.epoch(store)
        await beat(store, **change)
        assert await self.epoch(store) == e + 1

    async def test_registration_departure_death_and_acknowledged_weights_move_it(self, store):
        e0 = await self.epoch(store)
        await store.actor("a1")
        await store.actor("a2")
        e1 = await self.epoch(store)
        assert e1 == e0 + 2
        await store.scripts.leave_actor("a1")
        assert await self.epoch(store) == e1 + 1
        await store.redis.hset(store.k("a:a2"), "hb", 1)  # silent past its timeout: found dead by its heartbeat
        assert (await beat(store, "a2")).status == "dead"
        assert await self.epoch(store) == e1 + 2
        await store.actor("a3")
        e3 = await self.epoch(store)
        ack = dict(subscriber_id="a3", ok=True, error="", commit_order_id="")
        await store.scripts.ack_command(sequence=1, weights=weights(0), **ack)  # the same weights
        assert await self.epoch(store) == e3
        await store.scripts.ack_command(sequence=2, weights=weights(1), **ack)
        assert await self.epoch(store) == e3 + 1


class TestLeaveActor:
    async def test_unknown_actor_is_not_found(self, store):
        with pytest.raises(LedgerError) as exc:
            await store.scripts.leave_actor("ghost")
        assert exc.value.code == "NOT_FOUND"

    async def test_leases_it_holds_return_and_leases_assigned_to_it_lose_the_assignment(self, store):
        await store.ready_job(groups=2)
        await store.actor("a1")
        await store.redis.hset(store.k("quota"), "a1", 2)
        assigned = await store.acquire(holder="env-1", n=2)  # assigned to a1 by the step's quota
        assert all(le.assigned_actor_id == "a1" for le in assigned)
        [held] = await store.acquire(holder="a1")  # quota used up: held by a1, assigned to nobody
        left = await store.scripts.leave_actor("a1")
        assert (left.leases_returned, left.leases_unassigned) == (1, 2)
        assert (await store.hash("a:a1"))["live"] == str(LEFT)
        assert await store.redis.hexists(store.k("quota"), "a1") == 0
        row = await store.lease(held.lease_id)
        assert row["st"] == str(lp.LEASE_STATE_RELEASED) and row["rel"] == str(lp.RELEASE_REASON_SHUTDOWN)
        assert f"{held.group_id}|{held.sample_index}" in await store.zmembers("pool")
        for le in assigned:
            row = await store.lease(le.lease_id)
            assert row["st"] == str(lp.LEASE_STATE_ACTIVE) and row["as"] == ""
        again = await store.scripts.leave_actor("a1")
        assert (again.leases_returned, again.leases_unassigned) == (0, 0)


class TestAckCommand:
    async def ack(self, store, seq=1, ok=True, error="", order="", w=None, sub="a1"):
        return await store.scripts.ack_command(
            subscriber_id=sub, sequence=seq, ok=ok, error=error, commit_order_id=order, weights=w
        )

    async def test_records_once(self, store):
        assert await self.ack(store, order="o1") is True
        assert await self.ack(store, ok=False, error="late", order="o1") is False
        assert await store.hash("commit") == {"o1": "ok"}
        assert await store.hash("acks") == {"a1:1": "1|"}

    async def test_a_failed_commit_is_recorded_with_its_error(self, store):
        await self.ack(store, seq=4, ok=False, error="hash differs", order="o2")
        assert await store.hash("commit") == {"o2": "err:hash differs"}

    async def test_reported_weights_update_a_known_actor_only(self, store):
        await store.actor("a1", active=0)
        await self.ack(store, seq=1, w=weights(1))
        await self.ack(store, seq=2, w=weights(1), sub="ghost")
        w = await store.redis.hget(store.k("a:a1"), "w")
        assert common_pb2.ActorWeightState.FromString(w).active_version == 1
        assert await store.redis.exists(store.k("a:ghost")) == 0
