"""AcquireLeasesBatch and SubmitBatch against a real rollart-ledger over a real redis-server: every guarantee of
docs/ledger.md holds per item (idempotency per lease and trajectory, the first verdict stands, a refused item
changes nothing), malformed and oversized batches get clear errors and change nothing, and a SIGKILL of the
ledger (then of Redis) in the middle of batched settlement loses and duplicates nothing."""

from __future__ import annotations

import asyncio
import collections
import threading
import time

import grpc
import pytest

from rollart.local.processes import free_port, start_redis
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg
from tests.conftest import Services

from .conftest import start_ledger
from .helpers import acquire, dur, h, policy, prompts, status, trajectory, version

MAX_ITEMS = 256


def sub(lease: lp.Lease, holder: str | None = None, reward: float | None = 1.0, **kw) -> lp.SubmitRequest:
    t = kw.pop("traj", None) or trajectory(lease, scored=False, **kw)
    req = lp.SubmitRequest(trajectory=t, holder=holder or lease.holder)
    if reward is not None:
        req.reward.CopyFrom(common_pb2.RewardOutcome(trajectory_id=t.trajectory_id, reward=reward))
    return req


def batch(s, md, items: list[lp.SubmitRequest], timeout: float = 30) -> list[lp.SubmitBatchResult]:
    return list(s.SubmitBatch(lp.SubmitBatchRequest(submissions=items), metadata=md, timeout=timeout).results)


@pytest.fixture
def job(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, group_size=2)
    version(s, md, 0)
    prompts(s, md, 20, group_size=2)
    return s, md


def test_acquire_batch_serves_each_holder_as_acquire_would(job, ledger):
    s, md = job
    reqs = [lp.AcquireLeasesRequest(holder=f"env/{i}", max_leases=i + 1) for i in range(4)]
    out = s.AcquireLeasesBatch(lp.AcquireLeasesBatchRequest(requests=reqs), metadata=md).results
    assert [len(r.response.leases) for r in out] == [1, 2, 3, 4]
    for i, r in enumerate(out):
        assert not r.HasField("error")
        for le in r.response.leases:
            assert le.holder == f"env/{i}" and le.state == lp.LEASE_STATE_ACTIVE and le.version_hash == h(0)
            assert le.prompt.prompt_id  # the prompt travels with the lease, as from AcquireLeases
    ids = [le.lease_id for r in out for le in r.response.leases]
    assert len(set(ids)) == 10
    assert status(s, md).leases.active == 10
    # Each lease settles through the single-item RPC as well.
    le = out[0].response.leases[0]
    assert s.Submit(sub(le), metadata=md).admitted


def test_acquire_batch_waits_while_none_got_a_lease_and_wakes_for_new_prompts(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, group_size=2)
    version(s, md, 0)
    reqs = [lp.AcquireLeasesRequest(holder=f"env/{i}") for i in range(3)]
    t0 = time.monotonic()
    out = s.AcquireLeasesBatch(lp.AcquireLeasesBatchRequest(requests=reqs, wait=dur(0.3)), metadata=md).results
    assert time.monotonic() - t0 >= 0.25
    assert all(not r.response.leases and r.response.retry_after.ToMilliseconds() > 0 for r in out)

    got: list = []
    waiter = threading.Thread(
        target=lambda: got.append(
            s.AcquireLeasesBatch(lp.AcquireLeasesBatchRequest(requests=reqs, wait=dur(10)), metadata=md, timeout=15)
        )
    )
    waiter.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    prompts(s, md, 1, group_size=2)
    waiter.join(15)
    assert time.monotonic() - t0 < 5  # woken by AddPrompts, not by the end of its wait
    leased = [le for r in got[0].results for le in r.response.leases]
    assert len(leased) == 2 and len({le.holder for le in leased}) == 2


def test_submit_batch_settles_each_result_and_is_idempotent_per_lease_and_trajectory(job):
    s, md = job
    leases = acquire(s, md, "env/a", n=6)
    items = [sub(le) for le in leases]
    first = batch(s, md, items)
    assert all(r.response.admitted and not r.response.duplicate for r in first)
    assert [r.response.lease.trajectory_id for r in first] == [i.trajectory.trajectory_id for i in items]
    assert sum(r.response.group_complete for r in first) == 3
    st = status(s, md)
    assert st.settlement.admitted == 6 and st.buffer.samples == 6

    # The whole batch again (a client retrying after a lost reply): the first verdicts, counted once.
    again = batch(s, md, items)
    for a, b in zip(first, again):
        assert b.response.duplicate and b.response.admitted == a.response.admitted
        assert b.response.group_admitted == a.response.group_admitted
    st2 = status(s, md)
    assert st2.settlement.admitted == 6 and st2.settlement.duplicates == 6 and st2.buffer.samples == 6
    # The same results one by one: the same record answers.
    assert s.Submit(items[0], metadata=md).duplicate


def test_first_verdict_stands_and_items_are_judged_alone(job):
    s, md = job
    leases = acquire(s, md, "env/a", n=6)
    rejected = sub(leases[1], traj=trajectory(leases[1], hashes={0: h(9)}, scored=False))
    items = [
        sub(leases[0]),
        rejected,  # HASH_MISMATCH: a verdict, not an error
        sub(leases[2], holder="env/other"),  # WRONG_HOLDER: changes nothing
        sub(leases[3]),
    ]
    out = batch(s, md, items)
    assert out[0].response.admitted and out[3].response.admitted
    assert out[1].response.reason == lp.REJECTION_REASON_HASH_MISMATCH and not out[1].response.admitted
    assert out[2].response.reason == lp.REJECTION_REASON_WRONG_HOLDER
    assert s.GetLease(lp.GetLeaseRequest(lease_id=leases[2].lease_id), metadata=md).state == lp.LEASE_STATE_ACTIVE

    # Another trajectory for a settled or rejected lease: ALREADY_SETTLED; the first one's record is kept.
    out2 = batch(s, md, [sub(leases[0]), sub(leases[1])])
    assert [r.response.reason for r in out2] == [lp.REJECTION_REASON_ALREADY_SETTLED] * 2
    (again,) = batch(s, md, [items[1]])  # the rejected result itself again: its first verdict
    assert again.response.duplicate and again.response.reason == lp.REJECTION_REASON_HASH_MISMATCH
    lease0 = s.GetLease(lp.GetLeaseRequest(lease_id=leases[0].lease_id), metadata=md)
    assert lease0.state == lp.LEASE_STATE_SETTLED and lease0.trajectory_id == items[0].trajectory.trajectory_id

    # A trajectory id already used for another lease is refused in its item (ALREADY_EXISTS), a malformed item
    # in its item (INVALID_ARGUMENT): nothing changes for them, the other items settle.
    before = status(s, md)
    reused = sub(leases[4], traj=trajectory(leases[4], tid=items[0].trajectory.trajectory_id, scored=False))
    malformed = sub(leases[5])
    malformed.trajectory.turns[0].action_versions.append(0)  # one version more than tokens
    good = sub(leases[2])  # its holder this time
    out3 = batch(s, md, [reused, malformed, good])
    assert out3[0].error.code == grpc.StatusCode.ALREADY_EXISTS.value[0]
    assert "submissions[0]" in out3[0].error.message
    assert out3[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert out3[1].error.message.startswith("submissions[1].")
    assert not out3[0].HasField("response") and not out3[1].HasField("response")
    assert out3[2].response.admitted
    after = status(s, md)
    assert after.settlement.admitted == before.settlement.admitted + 1
    for le in leases[4:]:
        assert s.GetLease(lp.GetLeaseRequest(lease_id=le.lease_id), metadata=md).state == lp.LEASE_STATE_ACTIVE


def snapshot(s, md):
    st = s.GetStatus(lp.LedgerStatusRequest(include_inactive_actors=True), metadata=md)
    st.ClearField("server_time")
    return st, s.ListLeases(lp.ListLeasesRequest(page_size=1000), metadata=md)


def test_malformed_oversized_and_unauthorised_batches_get_clear_errors_and_change_nothing(job, rpc_error):
    s, md = job
    leases = acquire(s, md, "env/a", n=3)
    items = [sub(le) for le in leases]
    dup_traj = sub(leases[1], traj=trajectory(leases[1], tid=items[0].trajectory.trajectory_id, scored=False))
    acq = lp.AcquireLeasesRequest
    cases = [
        (s.SubmitBatch, lp.SubmitBatchRequest(), "INVALID_ARGUMENT", "1 to 256"),
        (s.SubmitBatch, lp.SubmitBatchRequest(submissions=[items[0]] * (MAX_ITEMS + 1)), "INVALID_ARGUMENT", "257"),
        (s.SubmitBatch, lp.SubmitBatchRequest(submissions=[items[0], items[1], items[0]]), "INVALID_ARGUMENT",
         "one result per lease"),
        (s.SubmitBatch, lp.SubmitBatchRequest(submissions=[items[0], dup_traj]), "INVALID_ARGUMENT", "trajectory"),
        (s.AcquireLeasesBatch, lp.AcquireLeasesBatchRequest(), "INVALID_ARGUMENT", "1 to 256"),
        (s.AcquireLeasesBatch, lp.AcquireLeasesBatchRequest(requests=[acq(holder=f"e/{i}") for i in range(257)]),
         "INVALID_ARGUMENT", "257"),
        (s.AcquireLeasesBatch, lp.AcquireLeasesBatchRequest(requests=[acq(holder="e/1"), acq(holder="e/1")]),
         "INVALID_ARGUMENT", "one request per holder"),
        (s.AcquireLeasesBatch, lp.AcquireLeasesBatchRequest(requests=[acq(holder="e/1"), acq(holder="bad holder!")]),
         "INVALID_ARGUMENT", "requests[1].holder"),
        (s.AcquireLeasesBatch, lp.AcquireLeasesBatchRequest(requests=[acq(holder=f"e/{i}", max_leases=600) for i in range(2)]),
         "INVALID_ARGUMENT", "1200 leases"),
        (s.AcquireLeasesBatch, lp.AcquireLeasesBatchRequest(requests=[acq(holder="e/1")], wait=dur(-1)),
         "INVALID_ARGUMENT", "wait"),
    ]
    before = snapshot(s, md)
    for fn, req, code, words in cases:
        err = rpc_error(fn, req, metadata=md, timeout=10)
        assert err.code().name == code and words in err.details(), (code, err.details())
    # Over the ledger's receive limit (16 MiB): refused before it is read.
    big = [sub(le) for le in leases]
    for x in big:
        x.trajectory.prompt_token_ids.extend([2**31 - 1] * 1_200_000)  # ~6 MB each
    err = rpc_error(s.SubmitBatch, lp.SubmitBatchRequest(submissions=big), metadata=md, timeout=30)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Without the job's token.
    for metadata in ([], [("authorization", "Bearer wrong")]):
        for fn, req in ((s.SubmitBatch, lp.SubmitBatchRequest(submissions=items)),
                        (s.AcquireLeasesBatch, lp.AcquireLeasesBatchRequest(requests=[acq(holder="e/1")]))):
            assert rpc_error(fn, req, metadata=metadata).code() == grpc.StatusCode.UNAUTHENTICATED
    # An unknown group filter is refused in its item only; the other request is served.
    out = s.AcquireLeasesBatch(
        lp.AcquireLeasesBatchRequest(requests=[acq(holder="e/1", group_id="nogroup"), acq(holder="e/2")]), metadata=md
    ).results
    assert out[0].error.code == grpc.StatusCode.NOT_FOUND.value[0] and "requests[0]" in out[0].error.message
    assert len(out[1].response.leases) == 1
    s.ReleaseLease(lp.ReleaseLeaseRequest(lease_id=out[1].response.leases[0].lease_id, holder="e/2"), metadata=md)
    st, ls = snapshot(s, md)
    assert st.settlement == before[0].settlement and st.leases.active == before[0].leases.active
    assert st.buffer == before[0].buffer


CLIENTS = 4
PER_BATCH = 16


def test_sigkill_mid_batch_loses_and_duplicates_nothing(tmp_path, channel_factory, auth_md):
    """Clients settle in batches of 16 (AcquireLeasesBatch, SubmitBatch) while the ledger is SIGKILLed, then its
    redis-server; after both restart, every acknowledged verdict is there, and retrying every batch (acknowledged
    or not) settles each result exactly once."""
    md = auth_md
    port = free_port()
    redis_proc, url = start_redis(tmp_path / "store", port=port)  # AOF, appendfsync always
    services = Services(tmp_path / "svc")
    try:
        proc, address = start_ledger(services, url)
        s = lg.LedgerStub(channel_factory(address))
        policy(s, md, group_size=2, initial_lease_ttl=120, min_lease_ttl=60, max_lease_ttl=600)
        version(s, md, 0)
        s.AddPrompts(lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id=f"p{i}", task="math") for i in range(2000)]),
                     metadata=md)
        acked: dict[str, lp.SubmitResponse] = {}  # trajectory id -> verdict acknowledged before the kill
        sent: list[list[lp.SubmitRequest]] = []  # every batch sent, acknowledged or not
        in_flight = collections.Counter()

        async def client(c: int, stub: lg.LedgerStub) -> None:
            holders = [f"env/{c}/{j}" for j in range(PER_BATCH)]
            try:
                while True:
                    reqs = [lp.AcquireLeasesRequest(holder=hd) for hd in holders]
                    got = await stub.AcquireLeasesBatch(lp.AcquireLeasesBatchRequest(requests=reqs), metadata=md,
                                                        timeout=5)
                    items = [sub(le) for r in got.results for le in r.response.leases]
                    sent.append(items)
                    in_flight[c] += 1
                    out = await stub.SubmitBatch(lp.SubmitBatchRequest(submissions=items), metadata=md, timeout=5)
                    in_flight[c] -= 1
                    for item, r in zip(items, out.results):
                        assert r.response.admitted, r
                        acked[item.trajectory.trajectory_id] = r.response
            except grpc.aio.AioRpcError:
                return  # the ledger is gone

        async def traffic() -> None:
            ch = grpc.aio.insecure_channel(address)
            stub = lg.LedgerStub(ch)
            tasks = [asyncio.create_task(client(c, stub)) for c in range(CLIENTS)]
            while len(acked) < 300:
                await asyncio.sleep(0.01)
            proc.kill()  # SIGKILL while batches are in flight
            await asyncio.wait(tasks, timeout=10)
            await ch.close()

        asyncio.run(traffic())
        assert len(acked) >= 300
        unacked_batches = sum(in_flight.values())
        redis_proc.kill()
        redis_proc, url2 = start_redis(tmp_path / "store", port=port)
        assert url2 == url
        _, address2 = start_ledger(services, url)
        s = lg.LedgerStub(channel_factory(address2))

        leases: dict[str, lp.Lease] = {}
        token = ""
        while True:
            page = s.ListLeases(lp.ListLeasesRequest(page_size=1000, page_token=token), metadata=md)
            leases.update((le.lease_id, le) for le in page.leases)
            token = page.next_page_token
            if not token:
                break
        for tid, verdict in acked.items():
            le = leases[verdict.lease.lease_id]
            assert le.state == lp.LEASE_STATE_SETTLED and le.trajectory_id == tid
        st = status(s, md)
        assert st.settlement.admitted >= len(acked)

        # Every batch sent is retried whole: acknowledged results come back as duplicates with their verdict;
        # results of the batches cut by the kill settle now unless they did before (then as duplicates).
        retried_dup = retried_new = 0
        for items in sent:
            if not items:
                continue
            for item, r in zip(items, batch(s, md, items)):
                tid = item.trajectory.trajectory_id
                assert r.response.admitted, r
                if tid in acked:
                    assert r.response.duplicate
                    assert r.response.group_admitted == acked[tid].group_admitted
                retried_dup += r.response.duplicate
                retried_new += not r.response.duplicate
        assert retried_new <= unacked_batches * PER_BATCH
        final = status(s, md)
        submitted = {item.trajectory.trajectory_id for items in sent for item in items}
        assert final.settlement.admitted == len(submitted) == final.buffer.samples  # each exactly once
        settled = [le for le in leases.values() if le.state == lp.LEASE_STATE_SETTLED]
        slots = collections.Counter((le.group_id, le.sample_index) for le in settled)
        assert not slots or max(slots.values()) == 1  # no sample admitted twice
    finally:
        services.stop_all()
        redis_proc.stop()


def test_batches_from_many_holders_at_once(job, ledger, channel_factory):
    """Concurrent batches from several clients: every lease is issued once and settled once."""
    s, md = job
    s.AddPrompts(lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id=f"q{i}", task="math") for i in range(200)],
                                      group_size=2), metadata=md)
    got: list[lp.SubmitBatchResult] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        stub = lg.LedgerStub(channel_factory(ledger.address))
        for _ in range(5):
            reqs = [lp.AcquireLeasesRequest(holder=f"env/{c}/{j}", max_leases=2) for j in range(8)]
            out = stub.AcquireLeasesBatch(lp.AcquireLeasesBatchRequest(requests=reqs), metadata=md).results
            items = [sub(le) for r in out for le in r.response.leases]
            if items:
                res = batch(stub, md, items)
                with lock:
                    got.extend(res)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got and all(r.response.admitted for r in got)
    assert len({r.response.lease.lease_id for r in got}) == len(got)
    assert status(s, md).settlement.admitted == len(got)



def test_more_concurrent_calls_than_redis_connections_wait_instead_of_failing(services, redis_url, auth_md):
    """256 actors heartbeating at once through a ledger allowed 4 Redis connections: every call is served."""
    md = auth_md
    _, address = start_ledger(services, redis_url, ROLLART_REDIS_MAX_CONNECTIONS="4")

    async def run() -> list:
        async with grpc.aio.insecure_channel(address) as ch:
            s = lg.LedgerStub(ch)
            await s.SetJobPolicy(lp.SetJobPolicyRequest(policy=lp.JobPolicy(job_id="job-1")), metadata=md)
            actors = [f"a{i}" for i in range(256)]
            await asyncio.gather(*(s.RegisterActor(lp.RegisterActorRequest(actor=lp.LedgerActor(
                actor_id=a, endpoint="127.0.0.1:1")), metadata=md) for a in actors))
            return await asyncio.gather(
                *(s.ActorHeartbeat(lp.ActorHeartbeatRequest(actor_id=a), metadata=md, timeout=30) for a in actors),
                return_exceptions=True,
            )

    out = asyncio.run(run())
    assert all(isinstance(r, lp.ActorHeartbeatResponse) for r in out), [r for r in out if isinstance(r, Exception)][:3]
