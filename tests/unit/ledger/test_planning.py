"""Step planning: the pure plan (make_plan, apply_commit_states) and StepPlanner's transaction on a real Redis."""

from __future__ import annotations

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart_ledger import policy as pol
from rollart_ledger.errors import LedgerError
from rollart_ledger.planning import StepPlanner, apply_commit_states, commit_order_id, make_plan
from tests.integration.ledger.helpers import h, weights

EX = lp.ExclusionReason
K = lp.SubscriberKind
NOW = 1_700_000_000_000
V2 = common_pb2.PolicyVersion(version=2, base_version=1, hash=h(2))


def actor(aid, tau=1000.0, active=2, staged=(), live=lp.ACTOR_LIVENESS_ALIVE, relay="", excluded=0, loaded=True):
    w = weights(active, staged)
    w.loaded = loaded
    return lp.LedgerActor(actor_id=aid, tau=tau, weights=w, liveness=live, relay_id=relay, excluded_steps=excluded)


def plan(actors, batch=300, policy=None, deadline=None):
    return make_plan(
        step=5,
        version=V2,
        batch_size=batch,
        commit_deadline=deadline,
        actors={a.actor_id: a for a in actors},
        policy=policy or pol.DEFAULTS,
        now=NOW,
    )


class TestMakePlan:
    def test_splits_b_in_proportion_to_tau_fastest_first(self):
        draft = plan([actor("slow", tau=2500.0), actor("fast", tau=5000.0)])
        p = draft.plan
        assert [(a.actor_id, a.requests) for a in p.allocations] == [("fast", 200), ("slow", 100)]
        assert (p.step, p.version, p.version_hash, p.batch_size, p.total_tau) == (5, 2, h(2), 300, 7500.0)
        assert p.all_committed and not p.excluded
        assert p.planned_at.ToMilliseconds() == NOW and p.commit_deadline.ToMilliseconds() == NOW + 60_000
        assert {a: (u.tau, u.excluded_steps) for a, u in draft.tau_updates.items()} == {
            "fast": (5000.0, 0),
            "slow": (2500.0, 0),
        }
        [broadcast] = draft.commands
        assert broadcast.target == "" and broadcast.kinds == (K.SUBSCRIBER_KIND_ROUTER, K.SUBSCRIBER_KIND_TRAINER)
        assert broadcast.command.step_planned == p

    def test_uniform_allocation_splits_b_evenly_whatever_tau(self):
        actors = [actor("slow", tau=1000.0), actor("fast", tau=3000.0)]
        by_tau = {a.actor_id: a.requests for a in plan(actors, batch=32).plan.allocations}
        even = {
            a.actor_id: a.requests
            for a in plan(actors, batch=32, policy={**pol.DEFAULTS, "unif": 1.0}).plan.allocations
        }
        assert by_tau == {"fast": 24, "slow": 8} and even == {"fast": 16, "slow": 16}
        p = lp.JobPolicy(job_id="j", uniform_allocation=True)
        assert pol.fields(pol.fill(p, "j"))["unif"] == 1.0 and pol.fields(pol.defaults("j"))["unif"] == 0.0

    def test_an_actor_on_v_minus_1_with_v_staged_needs_a_commit_sent_to_it_and_its_relay(self):
        deadline = Timestamp()
        deadline.FromMilliseconds(NOW + 5000)
        draft = plan([actor("a", active=1, staged=(2,), relay="r1")], batch=8, deadline=deadline)
        [al] = draft.plan.allocations
        assert al.needs_commit and not al.committed and al.commit_order_id == commit_order_id(5, 2, "a")
        assert not draft.plan.all_committed
        to_actor, to_relay, planned = draft.commands
        assert (to_actor.target, to_actor.kinds, to_actor.ack_required) == ("a", (K.SUBSCRIBER_KIND_ACTOR,), True)
        assert (to_relay.target, to_relay.kinds, to_relay.ack_required) == ("r1", (K.SUBSCRIBER_KIND_RELAY,), False)
        order = to_actor.command.commit
        assert (order.order_id, order.version, order.base_version, order.hash, list(order.actor_ids)) == (
            al.commit_order_id, 2, 1, h(2), ["a"]
        )  # fmt: skip
        assert order.deadline.ToMilliseconds() == NOW + 5000
        assert to_relay.command == to_actor.command
        assert planned.command.WhichOneof("command") == "step_planned"

    def test_excluded_actors_decay_and_a_lagging_one_is_asked_to_stage_v(self):
        draft = plan(
            [
                actor("ok", tau=100.0),
                actor("behind", tau=400.0, active=1, excluded=2),  # v-1 without v staged
                actor("old", tau=400.0, active=0),
                actor("dead", tau=400.0, live=lp.ACTOR_LIVENESS_DEAD, active=1),
                actor("drain", tau=400.0, live=lp.ACTOR_LIVENESS_DRAINING, active=1),
                actor("left", live=lp.ACTOR_LIVENESS_LEFT),
            ],
            policy={**pol.DEFAULTS, "decay": 0.25},
        )
        reasons = {e.actor_id: (e.reason, e.tau_after) for e in draft.plan.excluded}
        assert reasons == {
            "behind": (EX.EXCLUSION_REASON_DELTA_NOT_STAGED, 100.0),
            "old": (EX.EXCLUSION_REASON_WRONG_VERSION, 100.0),
            "dead": (EX.EXCLUSION_REASON_DEAD, 100.0),
            "drain": (EX.EXCLUSION_REASON_DRAINING, 100.0),
        }
        assert draft.tau_updates["behind"].excluded_steps == 3 and "left" not in draft.tau_updates
        staged = [c.target for c in draft.commands if c.command.WhichOneof("command") == "stage_version"]
        assert staged == ["behind", "old"]  # alive, not draining, behind
        assert draft.commands[0].command.stage_version.version == V2

    def test_an_eligible_actor_with_a_zero_share_is_listed_without_decay(self):
        draft = plan([actor("big", tau=1e6), actor("tiny", tau=1.0, excluded=4)], batch=10)
        assert [a.actor_id for a in draft.plan.allocations] == ["big"]
        [z] = draft.plan.excluded
        assert (z.actor_id, z.reason, z.tau_after) == ("tiny", EX.EXCLUSION_REASON_ZERO_SHARE, 1.0)
        assert draft.tau_updates["tiny"].excluded_steps == 5

    def test_no_eligible_actor_is_a_failed_precondition_naming_each_actor(self):
        with pytest.raises(LedgerError) as exc:
            plan([actor("x", active=0), actor("y", loaded=False)])
        assert exc.value.code == "FAILED_PRECONDITION"
        assert "x: EXCLUSION_REASON_WRONG_VERSION" in exc.value.message and "y:" in exc.value.message
        with pytest.raises(LedgerError, match="actors: none"):
            plan([])


class TestApplyCommitStates:
    def draft(self):
        return plan([actor("a", active=1, staged=(2,)), actor("b", active=1, staged=(2,)), actor("c")], batch=9).plan

    def test_acknowledged_or_reported_active_is_committed(self):
        p = self.draft()
        ids = {al.actor_id: al.commit_order_id for al in p.allocations}
        apply_commit_states(p, {ids["a"]: b"ok"}, {"b": weights(2)})
        assert {al.actor_id: al.committed for al in p.allocations} == {"a": True, "b": True, "c": True}
        assert p.all_committed

    def test_a_failed_acknowledgement_is_the_commit_error(self):
        p = self.draft()
        ids = {al.actor_id: al.commit_order_id for al in p.allocations}
        apply_commit_states(p, {ids["a"]: b"err:hash differs", ids["b"]: None}, {"b": weights(1)})
        state = {al.actor_id: (al.committed, al.commit_error) for al in p.allocations}
        assert state == {"a": (False, "hash differs"), "b": (False, ""), "c": (True, "")}
        assert not p.all_committed


class TestStepPlanner:
    async def prepare(self, store, *actors):
        await store.policy()
        for v in (0, 1):
            await store.version(v)
        for aid, active, staged in actors:
            await store.actor(aid, active=active, staged=staged)
        return StepPlanner(store.redis, store.scripts, store.prefix)

    async def test_plans_once_and_returns_the_same_plan_after(self, store):
        planner = await self.prepare(store, ("a", 1, ()), ("b", 0, (1,)))
        got = await planner.plan(step=1, version=1, batch_size=4, commit_deadline=None)
        assert got.created
        assert {al.actor_id: al.requests for al in got.plan.allocations} == {"a": 2, "b": 2}
        assert await store.hash("cur") == {"step": "1", "v": "1", "B": "4"}
        assert await store.hash("quota") == {"a": "2", "b": "2"}
        b_alloc = next(al for al in got.plan.allocations if al.actor_id == "b")
        assert b_alloc.needs_commit and not got.plan.all_committed
        kinds = [c.WhichOneof("command") for c in await store.commands()]
        assert kinds[-2:] == ["commit", "step_planned"]

        again = await planner.plan(step=1, version=1, batch_size=99, commit_deadline=None)
        assert not again.created and again.plan.batch_size == 4
        await store.scripts.ack_command(
            subscriber_id="b", sequence=1, ok=True, error="", commit_order_id=b_alloc.commit_order_id, weights=None
        )
        assert (await planner.get(0)).all_committed

    async def test_refusals_change_nothing(self, store):
        planner = await self.prepare(store, ("a", 1, ()))
        await planner.plan(step=2, version=1, batch_size=4, commit_deadline=None)
        before = await store.redis.xlen(store.k("cmds"))
        for step, version, why in [
            (2, 0, "already planned with version 1"),
            (1, 1, "older than the current step 2"),
            (3, 0, "older than the current version 1"),
            (3, 7, "version 7 is not registered"),
        ]:
            with pytest.raises(LedgerError, match=why) as exc:
                await planner.plan(step=step, version=version, batch_size=4, commit_deadline=None)
            assert exc.value.code == "FAILED_PRECONDITION"
        await store.version(2)
        with pytest.raises(LedgerError, match="no actor is eligible"):
            await planner.plan(step=3, version=2, batch_size=4, commit_deadline=None)
        assert await store.hash("cur") == {"step": "2", "v": "1", "B": "4"}
        assert await store.redis.xlen(store.k("cmds")) == before + 1  # only RegisterVersion(2)'s broadcast

    async def test_heartbeats_and_settled_work_while_planning_do_not_make_it_retry(self, store, monkeypatch):
        """Between the plan's reads and its EXEC, every actor heartbeats with a throughput (tau moves) and its
        heartbeat time moves: the plan commits at the first attempt (it once watched every actor's hash and
        retried, up to ABORTED, under a high heartbeat or settle rate); a change of weights does make it retry."""
        actors = [(f"a{i}", 1, ()) for i in range(8)]
        planner = await self.prepare(store, *actors)
        commit = store.scripts.plan_commit
        calls: list[int] = []
        reweigh = {"on": False}

        async def busy_commit(**kw):
            calls.append(1)
            for aid, _, _ in actors:
                w = weights(1, (2,)) if reweigh["on"] and len(calls) == 1 else None
                await store.scripts.heartbeat(actor_id=aid, weights=w, observed_tokens_per_s=100.0 * len(calls),
                                              in_flight_requests=3, draining=False, relay_id="")  # fmt: skip
            return await commit(**kw)

        monkeypatch.setattr(store.scripts, "plan_commit", busy_commit)
        got = await planner.plan(step=1, version=1, batch_size=8, commit_deadline=None)
        assert got.created and len(calls) == 1
        taus = [float((await store.hash(f"a:{aid}"))["tau"]) for aid, _, _ in actors]
        assert taus == [100.0] * 8  # the observations made while planning are kept (the plan's factor was 1)

        calls.clear()
        reweigh["on"] = True  # the first attempt's heartbeats stage a new version: that plan is stale
        got = await planner.plan(step=2, version=1, batch_size=8, commit_deadline=None)
        assert got.created and len(calls) == 2

    async def test_get_of_a_step_never_planned_is_not_found(self, store):
        planner = await self.prepare(store)
        for step in (0, 4):
            with pytest.raises(LedgerError) as exc:
                await planner.get(step)
            assert exc.value.code == "NOT_FOUND"
