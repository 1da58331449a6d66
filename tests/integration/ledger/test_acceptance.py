"""Settlement against a real ledger: strict and bounded admission, hash checks, idempotency, the buffer."""

from __future__ import annotations

import threading
import time

import grpc

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp

from .helpers import acquire, actor, dur, h, heartbeat, policy, prompts, status, submit, trajectory, version

R = lp.RejectionReason
STRICT, BOUNDED = common_pb2.ADMISSION_POLICY_STRICT, common_pb2.ADMISSION_POLICY_BOUNDED


def setup_versions(s, md, n: int, plan_version: int | None = None, step: int = 1):
    for v in range(n):
        version(s, md, v)
    if plan_version is not None:
        actor(s, md, "a", active=plan_version)
        s.PlanStep(lp.PlanStepRequest(step=step, version=plan_version, batch_size=8), metadata=md)


def plan(s, md, step, v):
    heartbeat(s, md, "a", active=v)
    return s.PlanStep(lp.PlanStepRequest(step=step, version=v, batch_size=8), metadata=md)


def test_strict_policy_admits_only_tokens_of_the_lease_version(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, admission=STRICT, alpha=0)
    setup_versions(s, md, 2, plan_version=1)
    prompts(s, md, 2, group_size=2)
    a, b, c, d = acquire(s, md, "env/a", 4)
    assert a.version == 1 and a.version_hash == h(1)
    assert submit(s, md, a, versions=[[1, 1], [1]]).admitted
    mixed = submit(s, md, b, versions=[[1, 1], [0]])
    assert not mixed.admitted and mixed.reason == R.REJECTION_REASON_STALE and "strict" in mixed.detail
    older = submit(s, md, c, versions=[[0, 0]])
    assert older.reason == R.REJECTION_REASON_STALE
    # The lease version claimed by the trajectory must be the lease's.
    t = trajectory(d)
    t.lease_version = 0
    wrong = s.Submit(lp.SubmitRequest(trajectory=t, holder="env/a"), metadata=md)
    assert wrong.reason == R.REJECTION_REASON_STALE and "lease version" in wrong.detail
    # Rejected samples go back to the pool, to be generated again.
    st = status(s, md)
    assert st.leases.pending == 3 and st.settlement.admitted == 1 and st.settlement.rejected["REJECTION_REASON_STALE"] == 3


def test_bounded_policy_started_within_alpha_and_no_older_turn(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, admission=BOUNDED, alpha=1)
    setup_versions(s, md, 4, plan_version=2)  # n = 2, window [1, 2]
    prompts(s, md, 3, group_size=2)
    leases = acquire(s, md, "env/a", 6)
    assert {le.version for le in leases} == {2}
    # Started on 1 (>= n - alpha) and crossed to 2 after a KV recompute: admitted.
    assert submit(s, md, leases[0], versions=[[1, 1], [1, 2, 2]]).admitted
    assert submit(s, md, leases[1], versions=[[2, 2]]).admitted
    stale = submit(s, md, leases[2], versions=[[0, 1], [2]])
    assert not stale.admitted and stale.reason == R.REJECTION_REASON_STALE and "n - alpha = 1" in stale.detail
    # The job moves to n = 3 (window [2, 3]): a lease of v_j = 2 is still good, a trajectory that
    # started on 1 no longer is.
    plan(s, md, 2, 3)
    assert submit(s, md, leases[3], versions=[[2], [3, 3]]).admitted
    late = submit(s, md, leases[4], versions=[[1], [2]])
    assert late.reason == R.REJECTION_REASON_STALE
    # At n = 4 with alpha = 1 leases of v_j = 2 are outside the window: they were cancelled as stale and
    # their samples went back to the pool to be leased at the new version.
    version(s, md, 4)
    plan(s, md, 3, 4)
    got = s.GetLease(lp.GetLeaseRequest(lease_id=leases[5].lease_id), metadata=md)
    assert got.state == lp.LEASE_STATE_CANCELLED and got.cancel_reason == lp.CANCEL_REASON_STALE
    fresh = acquire(s, md, "env/b", 10)
    assert fresh and {le.version for le in fresh} == {4}


def test_hash_mismatch_and_unknown_version_are_rejected(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md)
    setup_versions(s, md, 2)
    prompts(s, md, 1, group_size=3)
    a, b, c = acquire(s, md, "env/a", 3)
    assert a.version == 1  # no plan yet: leases use the latest version
    bad = submit(s, md, a, hashes={1: b"\x00" * 32})
    assert not bad.admitted and bad.reason == R.REJECTION_REASON_HASH_MISMATCH
    assert bad.lease.state == lp.LEASE_STATE_REJECTED and bad.lease.rejection == R.REJECTION_REASON_HASH_MISMATCH
    unknown = submit(s, md, b, versions=[[9]])
    assert unknown.reason == R.REJECTION_REASON_UNKNOWN_VERSION
    # A partial hash map (a used version missing) is malformed input, not a verdict.
    t = trajectory(c, versions=[[0, 1]], hashes={1: h(1)})
    try:
        s.Submit(lp.SubmitRequest(trajectory=t, holder="env/a"), metadata=md)
        raise AssertionError("expected INVALID_ARGUMENT")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "version_hashes" in exc.details()
    assert submit(s, md, c, versions=[[0, 1]]).admitted
    assert status(s, md).leases.pending == 2


def test_duplicate_submission_counts_once(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md)
    setup_versions(s, md, 1)
    prompts(s, md, 1, group_size=2)
    a, b = acquire(s, md, "env/a", 2)
    t = trajectory(a)
    req = lp.SubmitRequest(trajectory=t, holder="env/a")
    first = s.Submit(req, metadata=md)
    again = s.Submit(req, metadata=md)
    assert first.admitted and not first.duplicate
    assert again.admitted and again.duplicate and again.group_admitted == first.group_admitted
    other = s.Submit(lp.SubmitRequest(trajectory=trajectory(a), holder="env/a"), metadata=md)
    assert not other.admitted and other.reason == R.REJECTION_REASON_ALREADY_SETTLED
    thief = submit(s, md, b, holder="env/z")
    assert thief.reason == R.REJECTION_REASON_WRONG_HOLDER and thief.lease.state == lp.LEASE_STATE_ACTIVE
    # The same trajectory id cannot settle a second lease.
    t2 = trajectory(b, tid=t.trajectory_id)
    try:
        s.Submit(lp.SubmitRequest(trajectory=t2, holder="env/a"), metadata=md)
        raise AssertionError("expected ALREADY_EXISTS")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.ALREADY_EXISTS
    st = status(s, md)
    assert st.settlement.admitted == 1 and st.settlement.duplicates == 1 and st.buffer.samples == 1
    assert s.GetLease(lp.GetLeaseRequest(lease_id=b.lease_id), metadata=md).state == lp.LEASE_STATE_ACTIVE


def test_unscored_samples_are_listed_under_their_holders_prefix_until_scored(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md)
    setup_versions(s, md, 1)
    prompts(s, md, 2, group_size=2)
    a, b = acquire(s, md, "em-1/g/0", 2)
    (c,) = acquire(s, md, "em-2/g/0", 1)
    va = submit(s, md, a, reward=None)
    submit(s, md, b)  # scored at settlement
    time.sleep(0.01)
    submit(s, md, c, reward=None)
    got = s.ListUnscored(lp.ListUnscoredRequest(holder_prefix="em-1/"), metadata=md)
    (u,) = got.samples
    assert u.lease.lease_id == a.lease_id and u.lease.state == lp.LEASE_STATE_SETTLED and u.lease.prompt.prompt_id
    assert u.trajectory.trajectory_id == va.lease.trajectory_id == u.lease.trajectory_id
    assert list(u.trajectory.turns[0].action_versions) == [0, 0, 0]
    assert u.admitted_at.ToMilliseconds() > 0 and not got.next_page_token
    # every holder's, one sample a page
    first = s.ListUnscored(lp.ListUnscoredRequest(max_samples=1), metadata=md)
    assert [x.lease.lease_id for x in first.samples] == [a.lease_id] and first.next_page_token
    rest = s.ListUnscored(lp.ListUnscoredRequest(max_samples=1, page_token=first.next_page_token), metadata=md)
    assert [x.lease.lease_id for x in rest.samples] == [c.lease_id] and not rest.next_page_token
    reward = common_pb2.RewardOutcome(reward=0.5)
    assert s.RecordReward(lp.RecordRewardRequest(trajectory_id=u.lease.trajectory_id, reward=reward), metadata=md).recorded
    assert not s.ListUnscored(lp.ListUnscoredRequest(holder_prefix="em-1/"), metadata=md).samples


def test_rewards_recorded_later_and_get_batch_waits_for_complete_groups(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md)
    setup_versions(s, md, 1)
    prompts(s, md, 1, group_size=2)
    a, b = acquire(s, md, "env/a", 2)
    va = submit(s, md, a, reward=None)
    vb = submit(s, md, b, reward=None)
    assert va.awaiting_reward and vb.group_complete
    tb = vb.lease.trajectory_id
    assert status(s, md).buffer.ready_groups == 0
    # GetBatch blocks until the rewards arrive.
    got: list = []
    thread = threading.Thread(
        target=lambda: got.append(s.GetBatch(lp.GetBatchRequest(step=1, batch_size=2, wait=dur(5)), metadata=md))
    )
    thread.start()
    time.sleep(0.3)
    assert not got
    ra = s.RecordReward(lp.RecordRewardRequest(trajectory_id=va.lease.trajectory_id, reward=common_pb2.RewardOutcome(reward=0.25)), metadata=md)
    assert ra.recorded and not ra.group_ready
    rb = s.RecordReward(lp.RecordRewardRequest(trajectory_id=tb, reward=common_pb2.RewardOutcome(reward=1.0)), metadata=md)
    assert rb.recorded and rb.group_ready
    thread.join(5)
    (batch,) = got
    assert batch.samples == 2 and [t.reward for t in batch.groups[0].trajectories] == [0.25, 1.0]
    assert all(t.scored for t in batch.groups[0].trajectories) and batch.waited.ToMilliseconds() >= 250
    # The first reward stands; an unknown trajectory is reported as such.
    dup = s.RecordReward(lp.RecordRewardRequest(trajectory_id=tb, reward=common_pb2.RewardOutcome(reward=0.0)), metadata=md)
    assert not dup.recorded and dup.reward == 1.0
    assert s.RecordReward(lp.RecordRewardRequest(trajectory_id="nope", reward=common_pb2.RewardOutcome(reward=1)), metadata=md).unknown_trajectory
    # Idempotent per step until acknowledged; then the step's batch is gone.
    assert s.GetBatch(lp.GetBatchRequest(step=1, batch_size=2), metadata=md).batch_id == batch.batch_id
    assert s.AckBatch(lp.AckBatchRequest(step=1, batch_id=batch.batch_id), metadata=md).released == 2
    assert s.AckBatch(lp.AckBatchRequest(step=1, batch_id=batch.batch_id), metadata=md).released == 0
    try:
        s.GetBatch(lp.GetBatchRequest(step=1, batch_size=2), metadata=md)
        raise AssertionError("expected FAILED_PRECONDITION")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert status(s, md).buffer.samples == 0


def test_failed_scoring_reissues_the_sample(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md)
    setup_versions(s, md, 1)
    prompts(s, md, 1, group_size=1)
    (a,) = acquire(s, md, "env/a")
    v = submit(s, md, a, reward=None)
    out = s.RecordReward(lp.RecordRewardRequest(trajectory_id=v.lease.trajectory_id, failed=True, failure_cause="judge down"), metadata=md)
    assert out.recorded
    st = status(s, md)
    assert (st.buffer.samples, st.leases.pending, st.open_groups) == (0, 1, 1)
    (again,) = acquire(s, md, "env/a")
    assert again.attempt == 2 and submit(s, md, again).admitted


def test_stale_samples_evicted_at_the_plan_or_before_a_batch_and_partial_batches(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, alpha=0)
    setup_versions(s, md, 2, plan_version=0)
    prompts(s, md, 1, group_size=2, prefix="old")
    for le in acquire(s, md, "env/a", 2):
        assert submit(s, md, le).admitted
    # Planning v1 evicts what no later batch can take (started below the floor 1) and re-pools it at once.
    plan(s, md, 2, 1)
    st = status(s, md)
    assert (st.buffer.evicted_total, st.buffer.samples, st.leases.pending) == (2, 0, 2)
    prompts(s, md, 1, group_size=2, prefix="new")
    # The evicted group's samples are leased again first (a started group), at the current version.
    again = acquire(s, md, "env/a", 2)
    assert [le.prompt.prompt_id for le in again] == ["old0", "old0"] and {le.version for le in again} == {1}
    fresh = acquire(s, md, "env/a", 2)
    assert [le.prompt.prompt_id for le in fresh] == ["new0", "new0"] and {le.version for le in fresh} == {1}
    for le in fresh:
        assert submit(s, md, le).admitted
    batch = s.GetBatch(lp.GetBatchRequest(step=2, batch_size=2, wait=dur(1)), metadata=md)
    assert batch.evicted == 0 and [g.prompt_id for g in batch.groups] == ["new0"]
    assert (batch.min_version, batch.max_version) == (1, 1)
    st = status(s, md)
    assert st.buffer.evicted_total == 2 and st.buffer.reserved_samples == 2 and st.leases.active == 2
    # Not enough samples: DEADLINE_EXCEEDED after the wait, or a partial batch when allowed.
    t0 = time.monotonic()
    try:
        s.GetBatch(lp.GetBatchRequest(step=3, batch_size=4, wait=dur(0.3)), metadata=md)
        raise AssertionError("expected DEADLINE_EXCEEDED")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 >= 0.25
    submit(s, md, again[0])
    submit(s, md, again[1])
    part = s.GetBatch(lp.GetBatchRequest(step=3, batch_size=4, wait=dur(0.2), allow_partial=True), metadata=md)
    assert part.partial and part.samples == 2 and part.groups[0].prompt_id == "old0"
    # GetBatch itself evicts what fell below its own floor (here a current version the plan has not reached).
    prompts(s, md, 1, group_size=2, prefix="late")
    for le in acquire(s, md, "env/a", 2):
        assert submit(s, md, le).admitted
    late = s.GetBatch(
        lp.GetBatchRequest(step=4, batch_size=2, current_version=2, wait=dur(0.2), allow_partial=True), metadata=md
    )
    assert late.evicted == 2 and late.samples == 0 and late.evicted_tokens == 6


def test_buffer_stays_within_alpha_times_e(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, alpha=1, group_size=2, buffer_capacity=0)  # derived: (alpha + 1) * max(E, B, G) = 4
    setup_versions(s, md, 1)
    prompts(s, md, 10, group_size=0)
    admitted = 0
    for _ in range(20):  # one environment (E = 1) working as fast as it can, no trainer consuming
        leases = acquire(s, md, "env/a")
        if not leases:
            break
        assert submit(s, md, leases[0]).admitted
        admitted += 1
    st = status(s, md)
    assert admitted == 4 and st.buffer.samples == 4 and st.buffer.capacity == 4 and st.leases.pending == 16
    # Consuming a batch makes room again.
    batch = s.GetBatch(lp.GetBatchRequest(step=1, batch_size=4), metadata=md)
    s.AckBatch(lp.AckBatchRequest(step=1, batch_id=batch.batch_id), metadata=md)
    assert len(acquire(s, md, "env/a")) == 1
