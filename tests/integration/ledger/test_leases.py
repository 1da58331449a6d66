"""Leases against a real ledger: expiry and re-issue, adaptive expiry, late results, redundant rollouts."""

from __future__ import annotations

import time

from rollart.v1 import ledger_pb2 as lp

from .helpers import Watch, acquire, policy, prompts, status, submit, version, wait_until

K = lp.SubscriberKind


def get(s, md, lease_id) -> lp.Lease:
    return s.GetLease(lp.GetLeaseRequest(lease_id=lease_id), metadata=md)


def test_expiry_and_reissue(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, initial_lease_ttl=0.6, min_lease_ttl=0.05)
    version(s, md, 0)
    prompts(s, md, 1, group_size=2)
    first = acquire(s, md, "env/a", 2)
    assert len(first) == 2 and all(le.attempt == 1 for le in first)
    assert all(abs(le.expires_at.ToMilliseconds() - le.issued_at.ToMilliseconds() - 600) <= 1 for le in first)
    assert acquire(s, md, "env/b", 1) == []  # nothing else to lease while they are held
    # A renewed lease stays; the other one expires and its sample goes back to the pool.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        renewed = s.RenewLease(lp.RenewLeaseRequest(lease_id=first[0].lease_id, holder="env/a"), metadata=md).lease
        assert renewed.state == lp.LEASE_STATE_ACTIVE
        time.sleep(0.1)
    assert get(s, md, first[1].lease_id).state == lp.LEASE_STATE_EXPIRED
    again = acquire(s, md, "env/b", 2, wait=1.0)
    assert [(le.group_id, le.sample_index, le.attempt) for le in again] == [(first[1].group_id, first[1].sample_index, 2)]
    assert again[0].lease_id != first[1].lease_id and again[0].holder == "env/b"
    st = status(s, md).leases
    assert (st.active, st.expired, st.pending) == (2, 1, 0)
    # An expired lease can no longer be renewed: the reply says so, and the holder must stop.
    late = s.RenewLease(lp.RenewLeaseRequest(lease_id=first[1].lease_id, holder="env/a"), metadata=md).lease
    assert late.state == lp.LEASE_STATE_EXPIRED


def test_waiting_acquire_gets_an_expired_sample(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, initial_lease_ttl=0.3, min_lease_ttl=0.05)
    version(s, md, 0)
    prompts(s, md, 1, group_size=1)
    (lease,) = acquire(s, md, "env/a")
    t0 = time.monotonic()
    (again,) = acquire(s, md, "env/b", wait=3.0)  # blocks until the first lease expires
    assert 0.2 < time.monotonic() - t0 < 3.0 and again.attempt == 2 and again.sample_index == lease.sample_index


def test_late_result_after_expiry_is_rejected(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, initial_lease_ttl=0.3, min_lease_ttl=0.05)
    version(s, md, 0)
    prompts(s, md, 1, group_size=1)
    (lease,) = acquire(s, md, "env/a")
    time.sleep(0.45)
    verdict = submit(s, md, lease)
    assert not verdict.admitted and verdict.reason == lp.REJECTION_REASON_EXPIRED and "expired" in verdict.detail
    assert verdict.lease.state == lp.LEASE_STATE_EXPIRED
    # The re-issued lease's result counts; the late one never does.
    (fresh,) = acquire(s, md, "env/b", wait=1.0)
    ok = submit(s, md, fresh)
    assert ok.admitted and ok.group_complete and ok.group_admitted == 1
    st = status(s, md)
    assert st.settlement.admitted == 1 and st.settlement.rejected == {"REJECTION_REASON_EXPIRED": 1}
    assert st.buffer.samples == 1


def test_expiry_adapts_to_the_median_completion_time(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, initial_lease_ttl=30, min_lease_ttl=0.05, max_lease_ttl=60, lease_ttl_multiplier=2.0)
    version(s, md, 0)
    prompts(s, md, 5, group_size=1)
    leases = acquire(s, md, "env/a", 5)
    assert all(le.expires_at.seconds - le.issued_at.seconds == 30 for le in leases)  # no observation yet
    time.sleep(0.3)
    for le in leases:
        assert submit(s, md, le).admitted
    st = status(s, md)
    median = st.median_completion_time.ToMilliseconds()
    assert 290 <= median <= 1500
    assert st.lease_ttl.ToMilliseconds() == 2 * median
    prompts(s, md, 1, group_size=1, prefix="q")
    (le,) = acquire(s, md, "env/a")
    assert le.expires_at.ToMilliseconds() - le.issued_at.ToMilliseconds() == 2 * median


def test_redundant_group_cancelled_when_complete_and_holders_told(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md)
    version(s, md, 0)
    prompts(s, md, 1, group_size=2, redundancy=2)
    watch = Watch(s, md, "env", K.SUBSCRIBER_KIND_HOLDER)  # one stream for all loops of envmanager "env"
    other = Watch(s, md, "env2", K.SUBSCRIBER_KIND_HOLDER)
    try:
        leases = [acquire(s, md, f"env/loop-{i}")[0] for i in range(4)]
        assert sorted(le.sample_index for le in leases) == [0, 1, 2, 3] and status(s, md).leases.pending == 0
        assert not submit(s, md, leases[0]).group_complete
        done = submit(s, md, leases[2])
        assert done.admitted and done.group_complete and done.group_admitted == 2
        for le in (leases[1], leases[3]):
            got = get(s, md, le.lease_id)
            assert got.state == lp.LEASE_STATE_CANCELLED and got.cancel_reason == lp.CANCEL_REASON_GROUP_COMPLETE
        watch.wait(lambda w: len(w.of("cancel_leases")) >= 2)
        told = {c.target: list(c.cancel_leases.lease_ids) for c in watch.of("cancel_leases")}
        assert told == {"env/loop-1": [leases[1].lease_id], "env/loop-3": [leases[3].lease_id]}
        assert all(c.cancel_leases.reason == lp.CANCEL_REASON_GROUP_COMPLETE for c in watch.of("cancel_leases"))
        time.sleep(0.2)
        assert other.of("cancel_leases") == []
        # A cancelled lease: renew reports it, a result for it is rejected, a release acknowledges it.
        renew = s.RenewLease(lp.RenewLeaseRequest(lease_id=leases[1].lease_id, holder="env/loop-1"), metadata=md)
        assert renew.lease.state == lp.LEASE_STATE_CANCELLED
        late = submit(s, md, leases[3])
        assert not late.admitted and late.reason == lp.REJECTION_REASON_CANCELLED
        rel = s.ReleaseLease(
            lp.ReleaseLeaseRequest(lease_id=leases[1].lease_id, holder="env/loop-1", reason=lp.RELEASE_REASON_CANCELLED),
            metadata=md,
        )
        assert rel.state == lp.LEASE_STATE_CANCELLED
        st = status(s, md)
        assert (st.leases.pending, st.leases.cancelled, st.open_groups, st.buffer.samples) == (0, 2, 0, 2)
        assert st.buffer.ready_groups == 1
    finally:
        watch.close()
        other.close()


def test_release_returns_the_sample_and_too_many_attempts_drop_the_group(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, max_lease_attempts=2)
    version(s, md, 0)
    prompts(s, md, 1, group_size=2)
    a, b = acquire(s, md, "env/a", 2)
    rel = s.ReleaseLease(lp.ReleaseLeaseRequest(lease_id=a.lease_id, holder="env/a", reason=lp.RELEASE_REASON_INFRA_FAILURE, cause="sandbox died"), metadata=md)
    assert rel.state == lp.LEASE_STATE_RELEASED and rel.release_reason == lp.RELEASE_REASON_INFRA_FAILURE
    (a2,) = acquire(s, md, "env/c")
    assert (a2.sample_index, a2.attempt) == (a.sample_index, 2)
    # Releasing again is idempotent.
    assert s.ReleaseLease(lp.ReleaseLeaseRequest(lease_id=a.lease_id, holder="env/a"), metadata=md) == rel
    watch = Watch(s, md, "env", K.SUBSCRIBER_KIND_HOLDER)
    try:
        # The second attempt fails too: the slot is closed, the group cannot complete and is dropped.
        s.ReleaseLease(lp.ReleaseLeaseRequest(lease_id=a2.lease_id, holder="env/c"), metadata=md)
        got = get(s, md, b.lease_id)
        assert got.state == lp.LEASE_STATE_CANCELLED and got.cancel_reason == lp.CANCEL_REASON_GROUP_DROPPED
        watch.wait(lambda w: w.of("cancel_leases"))
        assert watch.of("cancel_leases")[0].target == "env/a"
    finally:
        watch.close()
    st = status(s, md)
    assert (st.leases.pending, st.leases.active, st.open_groups) == (0, 0, 0)
    assert acquire(s, md, "env/d") == []


def test_manual_cancellation_by_group(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md)
    version(s, md, 0)
    ids = prompts(s, md, 2, group_size=2).group_ids
    leases = acquire(s, md, "env/a", 4)
    out = s.CancelLeases(lp.CancelLeasesRequest(group_ids=[ids[0]]), metadata=md)
    assert sorted(out.cancelled_lease_ids) == sorted(le.lease_id for le in leases if le.group_id == ids[0])
    assert s.CancelLeases(lp.CancelLeasesRequest(group_ids=[ids[0]]), metadata=md).cancelled_lease_ids == []
    assert wait_until(lambda: status(s, md).leases.active == 2)
