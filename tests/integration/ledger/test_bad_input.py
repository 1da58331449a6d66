"""Malformed, out-of-range and unauthenticated requests get clear gRPC errors and change nothing."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from rollart.local.processes import start_redis
from rollart.runtime.auth import bearer
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg
from tests.conftest import TOKEN, Services

from .conftest import LedgerEnv, start_ledger
from .helpers import acquire, actor, h, policy, prompts, trajectory, version


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """One ledger for the module: every case must leave its state as it found it, which the tests check."""
    tmp = tmp_path_factory.mktemp("ledger-bad-input")
    redis_proc, url = start_redis(tmp / "redis")
    services = Services(tmp)
    try:
        proc, address = start_ledger(services, url)
        channel = grpc.insecure_channel(address)
        s, md = lg.LedgerStub(channel), [bearer(TOKEN)]
        policy(s, md)
        version(s, md, 0)
        version(s, md, 1)
        actor(s, md, "a1", active=1)
        prompts(s, md, 2, group_size=2)
        (lease,) = acquire(s, md, "env/a")
        yield LedgerEnv(proc, address, s, md, url), lease
        channel.close()
    finally:
        services.stop_all()
        redis_proc.stop()


def snapshot(s, md):
    st = s.GetStatus(lp.LedgerStatusRequest(include_inactive_actors=True), metadata=md)
    st.ClearField("server_time")
    for a in st.actors:
        a.ClearField("last_heartbeat")
    return (
        st,
        s.ListLeases(lp.ListLeasesRequest(), metadata=md),
        s.ListVersions(lp.ListVersionsRequest(), metadata=md),
        s.GetJobPolicy(lp.GetJobPolicyRequest(), metadata=md),
    )


def traj(lease, **kw):
    t = trajectory(lease)
    for k, v in kw.items():
        setattr(t, k, v)
    return t


def bad_turns(lease):
    t = trajectory(lease)
    t.turns[0].action_versions.append(1)  # one more version than tokens
    return t


PV = common_pb2.PolicyVersion
CASES = [
    ("SetJobPolicy", lambda le: lp.SetJobPolicyRequest(), "INVALID_ARGUMENT"),
    ("SetJobPolicy", lambda le: lp.SetJobPolicyRequest(policy=lp.JobPolicy(job_id="job-2")), "FAILED_PRECONDITION"),
    ("SetJobPolicy", lambda le: lp.SetJobPolicyRequest(policy=lp.JobPolicy(job_id="job-1", alpha=-1)), "INVALID_ARGUMENT"),
    ("SetJobPolicy", lambda le: lp.SetJobPolicyRequest(policy=lp.JobPolicy(job_id="job-1", lease_ttl_multiplier=5)), "INVALID_ARGUMENT"),
    ("RegisterVersion", lambda le: lp.RegisterVersionRequest(version=PV(version=-1, hash=h(0))), "INVALID_ARGUMENT"),
    ("RegisterVersion", lambda le: lp.RegisterVersionRequest(version=PV(version=2, base_version=1, hash=b"abc")), "INVALID_ARGUMENT"),
    ("RegisterVersion", lambda le: lp.RegisterVersionRequest(version=PV(version=2, base_version=2, hash=h(2))), "INVALID_ARGUMENT"),
    ("RegisterVersion", lambda le: lp.RegisterVersionRequest(version=PV(version=1, base_version=0, hash=h(7))), "FAILED_PRECONDITION"),
    ("RegisterVersion", lambda le: lp.RegisterVersionRequest(version=PV(version=5, base_version=4, hash=h(5))), "FAILED_PRECONDITION"),
    # A version far above the latest (1) would end the job (every later one "not greater"): refused.
    ("RegisterVersion", lambda le: lp.RegisterVersionRequest(version=PV(version=2**63 - 1, base_version=0, hash=h(9))), "FAILED_PRECONDITION"),
    ("RegisterVersion", lambda le: lp.RegisterVersionRequest(version=PV(version=2**63 - 1, base_version=-1, hash=h(9))), "FAILED_PRECONDITION"),
    ("RegisterVersion", lambda le: lp.RegisterVersionRequest(version=PV(version=1026, base_version=1, hash=h(9))), "FAILED_PRECONDITION"),
    ("GetVersion", lambda le: lp.GetVersionRequest(version=99), "NOT_FOUND"),
    ("RegisterActor", lambda le: lp.RegisterActorRequest(actor=lp.LedgerActor(endpoint="x:1")), "INVALID_ARGUMENT"),
    ("RegisterActor", lambda le: lp.RegisterActorRequest(actor=lp.LedgerActor(actor_id="a2")), "INVALID_ARGUMENT"),
    ("RegisterActor", lambda le: lp.RegisterActorRequest(actor=lp.LedgerActor(actor_id="a2", endpoint="x:1", pd_role=9)), "INVALID_ARGUMENT"),
    ("ActorHeartbeat", lambda le: lp.ActorHeartbeatRequest(actor_id="nobody"), "NOT_FOUND"),
    ("ActorHeartbeat", lambda le: lp.ActorHeartbeatRequest(actor_id="a1", observed_tokens_per_s=-5), "INVALID_ARGUMENT"),
    ("ActorHeartbeat", lambda le: lp.ActorHeartbeatRequest(actor_id="a1", observed_tokens_per_s=float("nan")), "INVALID_ARGUMENT"),
    ("LeaveActor", lambda le: lp.LeaveActorRequest(actor_id="nobody"), "NOT_FOUND"),
    ("GetActor", lambda le: lp.GetActorRequest(actor_id="nobody"), "NOT_FOUND"),
    ("PlanStep", lambda le: lp.PlanStepRequest(step=0, version=1, batch_size=8), "INVALID_ARGUMENT"),
    ("PlanStep", lambda le: lp.PlanStepRequest(step=1, version=1, batch_size=0), "INVALID_ARGUMENT"),
    ("PlanStep", lambda le: lp.PlanStepRequest(step=1, version=7, batch_size=8), "FAILED_PRECONDITION"),
    ("PlanStep", lambda le: lp.PlanStepRequest(step=1, version=0, batch_size=8), "FAILED_PRECONDITION"),  # a1 is on 1
    ("GetStepPlan", lambda le: lp.GetStepPlanRequest(step=42), "NOT_FOUND"),
    ("AckCommand", lambda le: lp.AckCommandRequest(subscriber_id="a1", sequence=0), "INVALID_ARGUMENT"),
    ("AckCommand", lambda le: lp.AckCommandRequest(subscriber_id="a1", sequence=999), "NOT_FOUND"),
    ("AddPrompts", lambda le: lp.AddPromptsRequest(), "INVALID_ARGUMENT"),
    ("AddPrompts", lambda le: lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id="bad id!")]), "INVALID_ARGUMENT"),
    ("AddPrompts", lambda le: lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id="q")], group_ids=["g1", "g2"]), "INVALID_ARGUMENT"),
    ("AddPrompts", lambda le: lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id="q")], group_size=5000), "INVALID_ARGUMENT"),
    ("AddPrompts", lambda le: lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id="q")], priority=10**7), "INVALID_ARGUMENT"),
    ("AcquireLeases", lambda le: lp.AcquireLeasesRequest(), "INVALID_ARGUMENT"),
    ("AcquireLeases", lambda le: lp.AcquireLeasesRequest(holder="env/a", max_leases=5000), "INVALID_ARGUMENT"),
    ("AcquireLeases", lambda le: lp.AcquireLeasesRequest(holder="env/a", group_id="nogroup"), "NOT_FOUND"),
    ("AcquireLeases", lambda le: lp.AcquireLeasesRequest(holder="env/a", wait=Duration(seconds=-1)), "INVALID_ARGUMENT"),
    ("RenewLease", lambda le: lp.RenewLeaseRequest(lease_id="L999", holder="env/a"), "NOT_FOUND"),
    ("RenewLease", lambda le: lp.RenewLeaseRequest(lease_id=le.lease_id, holder="env/b"), "FAILED_PRECONDITION"),
    ("ReleaseLease", lambda le: lp.ReleaseLeaseRequest(lease_id=le.lease_id, holder="env/a", reason=99), "INVALID_ARGUMENT"),
    ("ReleaseLease", lambda le: lp.ReleaseLeaseRequest(lease_id=le.lease_id, holder="env/b"), "FAILED_PRECONDITION"),
    ("CancelLeases", lambda le: lp.CancelLeasesRequest(), "INVALID_ARGUMENT"),
    ("CancelLeases", lambda le: lp.CancelLeasesRequest(lease_ids=[le.lease_id, "L999"]), "NOT_FOUND"),
    ("GetLease", lambda le: lp.GetLeaseRequest(lease_id="L999"), "NOT_FOUND"),
    ("ListLeases", lambda le: lp.ListLeasesRequest(page_size=5000), "INVALID_ARGUMENT"),
    ("ListLeases", lambda le: lp.ListLeasesRequest(page_token="abc"), "INVALID_ARGUMENT"),
    ("Submit", lambda le: lp.SubmitRequest(holder="env/a"), "INVALID_ARGUMENT"),
    ("Submit", lambda le: lp.SubmitRequest(trajectory=trajectory(le)), "INVALID_ARGUMENT"),
    ("Submit", lambda le: lp.SubmitRequest(trajectory=bad_turns(le), holder="env/a"), "INVALID_ARGUMENT"),
    ("Submit", lambda le: lp.SubmitRequest(trajectory=traj(le, status=0), holder="env/a"), "INVALID_ARGUMENT"),
    ("Submit", lambda le: lp.SubmitRequest(trajectory=traj(le, lease_version=-2), holder="env/a"), "INVALID_ARGUMENT"),
    ("Submit", lambda le: lp.SubmitRequest(trajectory=traj(le, trajectory_id=""), holder="env/a"), "INVALID_ARGUMENT"),
    ("RecordReward", lambda le: lp.RecordRewardRequest(), "INVALID_ARGUMENT"),
    ("RecordReward", lambda le: lp.RecordRewardRequest(trajectory_id="t1"), "INVALID_ARGUMENT"),
    ("ListUnscored", lambda le: lp.ListUnscoredRequest(max_samples=5000), "INVALID_ARGUMENT"),
    ("ListUnscored", lambda le: lp.ListUnscoredRequest(page_token="abc"), "INVALID_ARGUMENT"),
    ("ListUnscored", lambda le: lp.ListUnscoredRequest(holder_prefix="bad prefix!"), "INVALID_ARGUMENT"),
    ("GetBatch", lambda le: lp.GetBatchRequest(step=1, batch_size=0), "INVALID_ARGUMENT"),
    ("GetBatch", lambda le: lp.GetBatchRequest(step=-1, batch_size=2), "INVALID_ARGUMENT"),
    ("GetBatch", lambda le: lp.GetBatchRequest(step=1, batch_size=2, drop_zero_variance=True, max_groups=-1), "INVALID_ARGUMENT"),
    ("GetBatch", lambda le: lp.GetBatchRequest(step=1, batch_size=2, drop_zero_variance=True, max_groups=2**31 - 1), "INVALID_ARGUMENT"),
    ("AckBatch", lambda le: lp.AckBatchRequest(step=3, batch_id="b3-1"), "NOT_FOUND"),
    ("AckBatch", lambda le: lp.AckBatchRequest(step=3), "INVALID_ARGUMENT"),
    ("GetStatus", lambda le: lp.LedgerStatusRequest(versions_limit=-1), "INVALID_ARGUMENT"),
]


@pytest.mark.parametrize("call, make, code", CASES, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_bad_requests_get_clear_errors_and_change_nothing(seeded, rpc_error, call, make, code):
    ledger, lease = seeded
    s, md = ledger.stub, ledger.md
    before = snapshot(s, md)
    err = rpc_error(getattr(s, call), make(lease), metadata=md, timeout=10)
    assert err.code().name == code, err.details()
    assert err.details()
    assert snapshot(s, md) == before


def test_bad_watch_requests(seeded, rpc_error):
    ledger, _ = seeded
    s, md = ledger.stub, ledger.md
    for req, code in (
        (lp.WatchCommandsRequest(subscriber_id="a1"), grpc.StatusCode.INVALID_ARGUMENT),
        (lp.WatchCommandsRequest(kind=lp.SUBSCRIBER_KIND_ACTOR), grpc.StatusCode.INVALID_ARGUMENT),
        (lp.WatchCommandsRequest(subscriber_id="a1", kind=lp.SUBSCRIBER_KIND_ACTOR, from_sequence=-3), grpc.StatusCode.INVALID_ARGUMENT),
    ):
        err = rpc_error(lambda r=req: next(iter(s.WatchCommands(r, metadata=md, timeout=5))))
        assert err.code() == code


def test_garbage_bytes_are_rejected(seeded, channel_factory, rpc_error):
    ledger, _ = seeded
    before = snapshot(ledger.stub, ledger.md)
    raw = channel_factory(ledger.address).unary_unary("/rollart.v1.Ledger/Submit")
    err = rpc_error(raw, b"\xff\xff\xff\xff not a protobuf", metadata=ledger.md)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert snapshot(ledger.stub, ledger.md) == before


@pytest.mark.parametrize("metadata", [[], [("authorization", "Bearer wrong")], [("authorization", "test-job-token-0123456789")]])
def test_unauthenticated_calls_are_refused_and_change_nothing(seeded, rpc_error, metadata):
    ledger, lease = seeded
    s, md = ledger.stub, ledger.md
    before = snapshot(s, md)
    calls = [
        (s.AcquireLeases, lp.AcquireLeasesRequest(holder="env/x", max_leases=4)),
        (s.Submit, lp.SubmitRequest(trajectory=trajectory(lease), holder="env/a")),
        (s.AddPrompts, lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id="intruder")])),
        (s.SetJobPolicy, lp.SetJobPolicyRequest(policy=lp.JobPolicy(job_id="job-1", alpha=5))),
        (s.GetStatus, lp.LedgerStatusRequest()),
    ]
    for fn, req in calls:
        assert rpc_error(fn, req, metadata=metadata).code() == grpc.StatusCode.UNAUTHENTICATED
    watch = lp.WatchCommandsRequest(subscriber_id="a1", kind=lp.SUBSCRIBER_KIND_ACTOR)
    err = rpc_error(lambda: next(iter(s.WatchCommands(watch, metadata=metadata, timeout=5))))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert snapshot(s, md) == before
