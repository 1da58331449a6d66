"""Step planning against a real ledger: the proportional split, eligibility and Commit(v), tau decay and
recovery, joins and leaves between steps."""

from __future__ import annotations

import time

import grpc

from rollart.v1 import ledger_pb2 as lp

from .helpers import Watch, acquire, actor, dur, heartbeat, policy, prompts, status, version, wait_until

EX = lp.ExclusionReason
K = lp.SubscriberKind


def plan(stub, md, step, v, batch):
    return stub.PlanStep(lp.PlanStepRequest(step=step, version=v, batch_size=batch), metadata=md)


def split(p: lp.StepPlan) -> dict[str, int]:
    return {a.actor_id: a.requests for a in p.allocations}


def test_worked_example_split_and_lease_assignment(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, buffer_capacity=10_000)
    version(s, md, 0)
    version(s, md, 1)
    for aid, tps in (("fast", 5000.0), ("slow", 2500.0)):
        actor(s, md, aid, active=1)
        assert heartbeat(s, md, aid, active=1, tps=tps).tau == tps  # the first observation replaces the prior
    p = plan(s, md, 1, 1, 300)
    assert split(p) == {"fast": 200, "slow": 100} and [a.actor_id for a in p.allocations] == ["fast", "slow"]
    assert p.total_tau == 7500 and p.all_committed and not p.excluded
    assert [(a.tau, a.needs_commit, a.committed) for a in p.allocations] == [(5000, False, True), (2500, False, True)]
    # The plan routes the step's leases: 300 samples assigned 200/100 (a preference the holders see).
    prompts(s, md, 150, group_size=2)
    leases = acquire(s, md, "env/0", 300)
    assert len(leases) == 300 and all(le.version == 1 and le.step == 1 for le in leases)
    assigned = [le.assigned_actor_id for le in leases]
    assert (assigned.count("fast"), assigned.count("slow")) == (200, 100)
    assert s.GetStepPlan(lp.GetStepPlanRequest(step=0), metadata=md) == p
    # Planning the same (step, version) again is idempotent.
    assert plan(s, md, 1, 1, 300) == p


def test_eligibility_commit_first_then_plan_and_acks(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md)
    for v in range(3):
        version(s, md, v)
    actor(s, md, "on2", active=2)
    actor(s, md, "on1-staged", active=1, staged=(2,), relay="relay-eu")
    actor(s, md, "on1", active=1)
    actor(s, md, "on0", active=0)
    router = Watch(s, md, "proxy", K.SUBSCRIBER_KIND_ROUTER)
    a1 = Watch(s, md, "on1-staged", K.SUBSCRIBER_KIND_ACTOR)
    relay = Watch(s, md, "relay-eu", K.SUBSCRIBER_KIND_RELAY)
    lagging = Watch(s, md, "on0", K.SUBSCRIBER_KIND_ACTOR)
    try:
        p = plan(s, md, 1, 2, 90)
        assert split(p) == {"on1-staged": 45, "on2": 45}
        staged = next(a for a in p.allocations if a.actor_id == "on1-staged")
        assert staged.needs_commit and not staged.committed and staged.commit_order_id and not p.all_committed
        assert {e.actor_id: e.reason for e in p.excluded} == {
            "on1": EX.EXCLUSION_REASON_DELTA_NOT_STAGED,
            "on0": EX.EXCLUSION_REASON_WRONG_VERSION,
        }
        # The actor gets Commit(2) (after the three VersionPublished broadcasts), before the plan is announced.
        a1.wait(lambda w: w.of("commit"))
        commit = a1.of("commit")[0]
        assert [v.version_published.version.version for v in a1.of("version_published")] == [0, 1, 2]
        assert commit.commit.version == 2 and commit.commit.base_version == 1 and commit.ack_required
        assert commit.commit.order_id == staged.commit_order_id and commit.target == "on1-staged"
        router.wait(lambda w: w.of("step_planned"))
        announced = router.of("step_planned")[0]
        assert announced.sequence > commit.sequence and split(announced.step_planned) == split(p)
        assert not router.of("commit") and not router.of("version_published")  # not a router's business
        # The relay of that actor propagates the same order; the lagging actor is asked to stage v.
        relay.wait(lambda w: w.of("commit"))
        assert relay.of("commit")[0].commit.order_id == commit.commit.order_id
        lagging.wait(lambda w: w.of("stage_version"))
        assert lagging.of("stage_version")[0].stage_version.version.version == 2 and not lagging.of("commit")

        t0 = time.monotonic()
        waited = s.AwaitStepCommitted(lp.AwaitStepCommittedRequest(step=1, wait=dur(0.3)), metadata=md)
        assert not waited.all_committed and time.monotonic() - t0 >= 0.25
        ack = s.AckCommand(lp.AckCommandRequest(subscriber_id="on1-staged", sequence=commit.sequence, ok=True), metadata=md)
        assert ack.recorded
        assert not s.AckCommand(lp.AckCommandRequest(subscriber_id="on1-staged", sequence=commit.sequence, ok=True), metadata=md).recorded
        done = s.AwaitStepCommitted(lp.AwaitStepCommittedRequest(step=1, wait=dur(5)), metadata=md)
        assert done.all_committed and all(a.committed for a in done.allocations)
        # Replay from a sequence: nothing before it, nothing missed after it.
        replay = Watch(s, md, "on1-staged", K.SUBSCRIBER_KIND_ACTOR, from_sequence=commit.sequence - 1)
        replay.wait(lambda w: w.of("commit"))
        replay.close()
        assert replay.items[0].sequence == commit.sequence
    finally:
        for w in (router, a1, relay, lagging):
            w.close()
    # Replanning the step with another version, or an older step, is refused.
    for step, v in ((1, 1), (0, 2)):
        try:
            plan(s, md, step, v, 10)
            raise AssertionError("expected an error")
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT)


def test_decay_of_an_excluded_actor_and_recovery(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, tau_decay=0.5, tau_ema_weight=0.5)
    for v in range(3):
        version(s, md, v)
    actor(s, md, "a", active=1)
    actor(s, md, "b", active=0)
    heartbeat(s, md, "a", active=1, tps=4000)
    heartbeat(s, md, "b", active=0, tps=4000)
    p1 = plan(s, md, 1, 1, 100)
    assert split(p1) == {"a": 100} and p1.excluded[0].tau_after == 2000
    p2 = plan(s, md, 2, 1, 100)
    assert p2.excluded[0].tau_after == 1000
    b = s.GetActor(lp.GetActorRequest(actor_id="b"), metadata=md)
    assert b.tau == 1000 and b.excluded_steps == 2
    # The allocated actor's tau did not decay.
    assert s.GetActor(lp.GetActorRequest(actor_id="a"), metadata=md).tau == 4000
    # b catches up to v2 (staged) and reports its real throughput: it is eligible again and tau climbs back.
    heartbeat(s, md, "a", active=2, tps=4000)
    assert heartbeat(s, md, "b", active=1, staged=(2,), tps=4000).tau == 2500  # 0.5 * 1000 + 0.5 * 4000
    p3 = plan(s, md, 3, 2, 130)
    assert split(p3) == {"a": 80, "b": 50}  # 130 * 4000/6500 = 80, 130 * 2500/6500 = 50
    assert [a.needs_commit for a in p3.allocations] == [False, True]
    taus = [heartbeat(s, md, "b", active=2, tps=4000).tau for _ in range(4)]
    assert taus == sorted(taus) and taus[-1] > 3900
    assert s.GetActor(lp.GetActorRequest(actor_id="b"), metadata=md).excluded_steps == 0


def test_joins_and_leaves_between_steps(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, actor_timeout=1.5, buffer_capacity=1000)
    version(s, md, 0)
    actor(s, md, "a", active=0)
    heartbeat(s, md, "a", active=0, tps=1000)
    assert split(plan(s, md, 1, 0, 10)) == {"a": 10}
    prompts(s, md, 5, group_size=2)
    held = acquire(s, md, "a", 4)  # an actor may hold leases itself
    assert all(le.assigned_actor_id == "a" for le in held)
    other = acquire(s, md, "env/1", 2)
    # b joins: the next step splits over both.
    actor(s, md, "b", active=0)
    heartbeat(s, md, "b", active=0, tps=3000)
    assert split(plan(s, md, 2, 0, 8)) == {"b": 6, "a": 2}
    pending = status(s, md).leases.pending
    left = s.LeaveActor(lp.LeaveActorRequest(actor_id="a", reason="scale-in"), metadata=md)
    assert left.leases_returned == 4 and left.leases_unassigned == 2  # the 2 of env/1
    assert status(s, md).leases.pending == pending + 4  # its samples are back in the pool at once
    assert {s.GetLease(lp.GetLeaseRequest(lease_id=le.lease_id), metadata=md).state for le in held} == {lp.LEASE_STATE_RELEASED}
    assert all(s.GetLease(lp.GetLeaseRequest(lease_id=le.lease_id), metadata=md).assigned_actor_id == "" for le in other)
    assert s.GetActor(lp.GetActorRequest(actor_id="a"), metadata=md).liveness == lp.ACTOR_LIVENESS_LEFT
    assert [a.actor_id for a in s.ListActors(lp.ListActorsRequest(), metadata=md).actors] == ["b"]
    assert split(plan(s, md, 3, 0, 8)) == {"b": 8}
    try:
        heartbeat(s, md, "a", active=0)
        raise AssertionError("a departed actor must register again")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND
    # c joins but never heartbeats: presumed dead after actor_timeout, then excluded as DEAD.
    actor(s, md, "c", active=0)

    def c_dead() -> bool:
        heartbeat(s, md, "b", active=0)  # b stays alive meanwhile
        return s.GetActor(lp.GetActorRequest(actor_id="c"), metadata=md).liveness == lp.ACTOR_LIVENESS_DEAD

    assert wait_until(c_dead, 6, interval=0.1)
    p4 = plan(s, md, 4, 0, 8)
    assert split(p4) == {"b": 8} and {e.actor_id: e.reason for e in p4.excluded} == {"c": EX.EXCLUSION_REASON_DEAD}
    # Registering again brings it back, with the tau it had.
    actor(s, md, "c", active=0)
    assert s.GetActor(lp.GetActorRequest(actor_id="c"), metadata=md).liveness == lp.ACTOR_LIVENESS_ALIVE
