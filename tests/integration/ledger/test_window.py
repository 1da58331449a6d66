"""The staleness window's scheduling rules and the generation accounting, against a real ledger and Redis.

The trainer's protocol (rollart-trainer) is followed exactly: step s asks for its batch with current version
s - 1; asynchronous modes ask for step s's batch before planning step s (v = s - 1), synchronous ones plan
step s + 1 (v = s) after training step s. Rules tested:

- in-flight work is sized to what the window's batches can take (derived capacity), and nothing is leased
  between a batch and the plan of the next version (no batch could take that work);
- PlanStep stops the work the next batch could not take: active leases below its floor are cancelled
  (STALE) and buffered samples below it evicted, their slots re-pooled and leased at the new version first;
- leases go to the started group closest to complete first;
- AT_START (AReaL) bounds staleness only when a trajectory starts: nothing is rejected, evicted or
  cancelled as stale;
- every generated token ends in one fate (trained, evicted, cancelled, rejected, failed), counted once;
- a SIGKILL of the ledger in the middle of a step with these rules on loses and duplicates nothing.
"""

from __future__ import annotations

import asyncio
import collections

import grpc

from rollart.local.processes import free_port, start_redis
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg

from .conftest import start_ledger
from .helpers import acquire, actor, dur, heartbeat, policy, prompts, status, submit, trajectory, version

AT_START = common_pb2.ADMISSION_POLICY_AT_START
TOKENS = 3  # action tokens of helpers.trajectory's default turn


def plan(s, md, step: int, v: int, batch: int):
    heartbeat(s, md, "a", active=v)
    return s.PlanStep(lp.PlanStepRequest(step=step, version=v, batch_size=batch), metadata=md)


def batch(s, md, step: int, size: int, wait: float = 0.0) -> lp.Batch:
    return s.GetBatch(lp.GetBatchRequest(step=step, batch_size=size, current_version=step - 1, wait=dur(wait)), metadata=md)


def release(s, md, lease: lp.Lease, reason: int, tokens: int) -> lp.Lease:
    req = lp.ReleaseLeaseRequest(lease_id=lease.lease_id, holder=lease.holder, reason=reason, generated_tokens=tokens)
    return s.ReleaseLease(req, metadata=md)


def fates(st: lp.LedgerStatus) -> dict[str, tuple[int, int]]:
    a = st.accounting
    return {f: (getattr(a, f).samples, getattr(a, f).tokens) for f in ("trained", "evicted", "cancelled", "rejected", "failed")}


def test_in_flight_work_is_sized_to_the_window_and_the_gap_leases_nothing(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, alpha=1, group_size=2, buffer_capacity=0)
    version(s, md, 0)
    actor(s, md, "a", active=0)
    prompts(s, md, 12, group_size=2)
    # Before any plan: (alpha + 1) * max(E, B, G) as before. Step 1's batch from the first samples.
    first = acquire(s, md, "env/0", 4)
    assert len(first) == 4 and all(submit(s, md, le).admitted for le in first)
    b1 = batch(s, md, 1, 4)
    assert b1.samples == 4
    plan(s, md, 1, 0, 4)  # asynchronous: planned after its batch; v0's work is for batch 2 alone (alpha = 1)
    window = acquire(s, md, "env/0", 10)
    assert len(window) == 4 and {le.version for le in window} == {0}  # B samples: what batch 2 can take
    assert acquire(s, md, "env/1", 1) == []
    assert all(submit(s, md, le).admitted for le in window)
    b2 = batch(s, md, 2, 4)
    assert b2.samples == 4 and b2.min_version == 0
    # Between batch 2 and the plan of v1: v0 work is useless to batch 3 (floor 1), so nothing is leased.
    assert acquire(s, md, "env/0", 10) == []
    s.AckBatch(lp.AckBatchRequest(step=1, batch_id=b1.batch_id), metadata=md)
    version(s, md, 1)
    plan(s, md, 2, 1, 4)
    nxt = acquire(s, md, "env/0", 10)
    assert len(nxt) == 4 and {le.version for le in nxt} == {1}
    st = status(s, md)
    assert st.buffer.evicted_total == 0 and st.leases.cancelled == 0  # nothing started was thrown away


def test_plan_step_repools_what_the_next_batch_cannot_take(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, alpha=1, group_size=2)  # an explicit capacity: leases beyond the window exist
    version(s, md, 0)
    actor(s, md, "a", active=0)
    prompts(s, md, 6, group_size=2)
    g01 = acquire(s, md, "env/0", 4)
    assert all(submit(s, md, le).admitted for le in g01)
    assert batch(s, md, 1, 2).samples == 2  # g0; g1 stays complete in the buffer
    plan(s, md, 1, 0, 2)
    g23 = acquire(s, md, "env/0", 4)
    assert {le.group_id for le in g23} == {g23[0].group_id, g23[2].group_id} and len(g23) == 4
    for le in g23[:3]:
        assert submit(s, md, le).admitted
    left = g23[3]  # g3's second member, still running on v0
    b2 = batch(s, md, 2, 2)
    assert b2.evicted == 0 and b2.min_version == 0 and b2.samples == 2  # g1: v0 is within batch 2's floor 0
    before = status(s, md)
    version(s, md, 1)
    plan(s, md, 2, 1, 2)  # batch 3's floor is 1: v0 work cannot be trained any more
    st = status(s, md)
    assert st.buffer.evicted_total == before.buffer.evicted_total + 3  # g2's two and g3's one, at the plan
    assert st.buffer.samples == before.buffer.samples - 3
    assert fates(st)["evicted"] == (3, 3 * TOKENS)
    gone = s.GetLease(lp.GetLeaseRequest(lease_id=left.lease_id), metadata=md)
    assert gone.state == lp.LEASE_STATE_CANCELLED and gone.cancel_reason == lp.CANCEL_REASON_STALE
    late = submit(s, md, left)
    assert not late.admitted and late.reason == lp.REJECTION_REASON_CANCELLED
    # The re-pooled slots of the started groups g2 and g3 are leased first, at v1.
    again = acquire(s, md, "env/0", 4)
    assert {le.group_id for le in again} == {g23[0].group_id, g23[2].group_id}
    assert {le.version for le in again} == {1}
    for le in again:
        assert submit(s, md, le).admitted
    b3 = batch(s, md, 3, 2)
    assert b3.min_version == 1 and b3.evicted == 0


def test_leases_go_to_the_started_group_closest_to_complete(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, group_size=3)
    version(s, md, 0)
    prompts(s, md, 3, group_size=3)  # pool order: g0, g1, g2
    g0 = acquire(s, md, "env/0", 1)[0]
    assert g0.sample_index == 0
    rest = acquire(s, md, "env/0", 5)  # g0's other two, then g1's three
    g1 = [le for le in rest if le.group_id != g0.group_id]
    assert len(g1) == 3
    for le in g1[:2]:
        assert submit(s, md, le).admitted
    release(s, md, g1[2], lp.RELEASE_REASON_INFRA_FAILURE, 5)  # g1: 2 of 3 admitted, one slot pending again
    for le in rest:
        if le.group_id == g0.group_id:
            release(s, md, le, lp.RELEASE_REASON_ABANDONED, 0)  # g0: 1 leased, 2 pending
    nxt = acquire(s, md, "env/1", 1)[0]
    assert nxt.group_id == g1[0].group_id  # 2 admitted beats 1 leased, though g0 is older
    assert fates(status(s, md))["failed"] == (1, 5) and fates(status(s, md))["cancelled"] == (2, 0)


def test_at_start_admission_bounds_staleness_only_at_the_start(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, alpha=1, group_size=2, admission=AT_START)
    version(s, md, 0)
    actor(s, md, "a", active=0)
    prompts(s, md, 4, group_size=2)
    old = acquire(s, md, "env/0", 4)
    assert {le.version for le in old} == {0}
    for v in (1, 2, 3):
        version(s, md, v)
    plan(s, md, 1, 3, 4)  # far beyond alpha: a bounded policy would cancel every v0 lease here
    assert status(s, md).leases.active == 4
    assert all(submit(s, md, le, versions=[[0, 0, 1], [2, 3]]).admitted for le in old)
    b = batch(s, md, 4, 4)  # floor 3 - 1: a bounded policy would evict all of them
    assert b.samples == 4 and b.evicted == 0 and b.min_version == 0


def test_every_generated_token_has_one_fate_counted_once(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, alpha=0, group_size=2, redundancy=1)
    version(s, md, 0)
    actor(s, md, "a", active=0)
    prompts(s, md, 3, group_size=2, redundancy=1)
    g = acquire(s, md, "env/0", 3)  # one group: 2 + 1 redundant
    assert len({le.group_id for le in g}) == 1
    assert submit(s, md, g[0], versions=[[0] * 4]).admitted
    dup = submit(s, md, g[0], versions=[[0] * 4], traj=None)
    assert not dup.admitted  # another trajectory for a settled lease: ALREADY_SETTLED, not counted again
    assert submit(s, md, g[1], versions=[[0] * 5]).admitted  # the group completes: g[2] is cancelled
    release(s, md, g[2], lp.RELEASE_REASON_CANCELLED, 7)
    release(s, md, g[2], lp.RELEASE_REASON_CANCELLED, 7)  # a second report of the same lease counts nothing
    h = acquire(s, md, "env/0", 3)
    bad = submit(s, md, h[0], hashes={0: b"x" * 32})  # HASH_MISMATCH: rejected
    assert not bad.admitted and bad.reason == lp.REJECTION_REASON_HASH_MISMATCH
    assert not submit(s, md, h[1], status=common_pb2.TRAJECTORY_STATUS_INFRA_FAILURE).admitted  # failed
    ok = submit(s, md, h[2], reward=None)  # waits for its reward, which fails
    assert ok.admitted and ok.awaiting_reward
    s.RecordReward(lp.RecordRewardRequest(trajectory_id=ok.lease.trajectory_id, failed=True), metadata=md)
    b = batch(s, md, 1, 2)
    s.AckBatch(lp.AckBatchRequest(step=1, batch_id=b.batch_id), metadata=md)
    s.AckBatch(lp.AckBatchRequest(step=1, batch_id=b.batch_id), metadata=md)  # idempotent
    st = status(s, md)
    assert fates(st) == {
        "trained": (2, 9),
        "evicted": (0, 0),
        "cancelled": (1, 7),
        "rejected": (1, TOKENS),
        "failed": (2, 2 * TOKENS),
    }
    assert abs(st.accounting.wasted_token_fraction - (7 + 3 * TOKENS) / (9 + 7 + 3 * TOKENS)) < 1e-9
    assert b.accounting.trained.samples == 0  # as of the batch's forming: nothing acknowledged yet


def test_sigkill_mid_step_with_the_window_rules_loses_and_duplicates_nothing(services, tmp_path, channel_factory, auth_md):
    """Loops lease and submit while a trainer loop runs the asynchronous protocol (GetBatch(s), PlanStep(s,
    s - 1), AckBatch) with the derived window; the ledger is SIGKILLed in the middle and restarted."""
    md = auth_md
    port = free_port()
    redis_proc, url = start_redis(tmp_path / "store", port=port)
    B, G = 4, 2
    try:
        proc, address = start_ledger(services, url)
        s = lg.LedgerStub(channel_factory(address))
        policy(s, md, alpha=1, group_size=G, buffer_capacity=0)
        for v in range(40):
            version(s, md, v)
        actor(s, md, "a", active=0)
        s.AddPrompts(lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id=f"p{i}", task="math") for i in range(400)],
                                          group_size=G), metadata=md)
        admitted: list[lp.SubmitResponse] = []
        trained: list[str] = []  # trajectory ids of acknowledged batches
        kill_at = asyncio.Event()

        async def loop(i: int, stub: lg.LedgerStub) -> None:
            holder = f"env/{i}"
            try:
                while True:
                    resp = await stub.AcquireLeases(lp.AcquireLeasesRequest(holder=holder, max_leases=1, wait=dur(0.2)),
                                                    metadata=md, timeout=2)
                    for lease in resp.leases:
                        await asyncio.sleep(0.01)
                        t = trajectory(lease)
                        req = lp.SubmitRequest(trajectory=t, holder=holder, reward=common_pb2.RewardOutcome(reward=1.0))
                        verdict = await stub.Submit(req, metadata=md, timeout=2)
                        if verdict.admitted:
                            admitted.append(verdict)
            except grpc.aio.AioRpcError:
                return

        async def trainer(stub: lg.LedgerStub, first: int, last: int) -> int:
            step = first
            try:
                while step <= last:
                    b = await stub.GetBatch(lp.GetBatchRequest(step=step, batch_size=B, current_version=step - 1,
                                                               wait=dur(5)), metadata=md, timeout=10)
                    await stub.ActorHeartbeat(lp.ActorHeartbeatRequest(actor_id="a", weights=_weights(step - 1)),
                                              metadata=md, timeout=2)
                    await stub.PlanStep(lp.PlanStepRequest(step=step, version=step - 1, batch_size=B), metadata=md,
                                        timeout=5)
                    if step == first + 3 and not kill_at.is_set():
                        kill_at.set()  # the ledger dies now, while this step trains (before its AckBatch)
                        await asyncio.sleep(1.0)
                    await stub.AckBatch(lp.AckBatchRequest(step=step, batch_id=b.batch_id), metadata=md, timeout=5)
                    trained.extend(t.trajectory_id for grp in b.groups for t in grp.trajectories)
                    step += 1
            except grpc.aio.AioRpcError:
                pass
            return step

        async def run(address: str, first: int, last: int, kill: bool) -> int:
            ch = grpc.aio.insecure_channel(address)
            stub = lg.LedgerStub(ch)
            loops = [asyncio.create_task(loop(i, stub)) for i in range(6)]
            tr = asyncio.create_task(trainer(stub, first, last))
            if kill:
                await asyncio.wait({tr, asyncio.create_task(kill_at.wait())}, return_when=asyncio.FIRST_COMPLETED)
                await asyncio.sleep(0.05)
                proc.kill()  # SIGKILL in the middle of a step: loops submitting, the trainer between calls
            nxt = await tr
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await ch.close()
            return nxt

        resume = asyncio.run(run(address, 1, 30, kill=True))
        assert 4 <= resume < 30
        _, address2 = start_ledger(services, url)
        s2 = lg.LedgerStub(channel_factory(address2))
        # The trainer goes on from the step it was in (the same batch is returned if it was formed).
        end = asyncio.run(run(address2, resume, resume + 4, kill=False))
        assert end == resume + 5

        st = status(s2, md)
        assert len(trained) == len(set(trained)) == B * (end - 1)  # no sample trained twice, none missing
        ids = [v.lease.trajectory_id for v in admitted]
        assert len(ids) == len(set(ids))
        leases = {}
        token = ""
        while True:
            page = s2.ListLeases(lp.ListLeasesRequest(page_size=1000, page_token=token), metadata=md)
            leases.update({le.lease_id: le for le in page.leases})
            token = page.next_page_token
            if not token:
                break
        settled = [le for le in leases.values() if le.state == lp.LEASE_STATE_SETTLED]
        assert set(trained) <= {le.trajectory_id for le in settled}
        for v in admitted:  # every acknowledged admission is still settled
            assert leases[v.lease.lease_id].state == lp.LEASE_STATE_SETTLED
        # Each admitted sample ended exactly one way: trained, evicted, or still in the buffer.
        f = fates(st)
        assert f["trained"][0] == len(trained)
        assert st.settlement.admitted == f["trained"][0] + f["evicted"][0] + f["failed"][0] + st.buffer.samples
        per_slot = collections.Counter((le.group_id, le.sample_index) for le in settled)
        trained_slots = collections.Counter(
            (le.group_id, le.sample_index) for le in settled if le.trajectory_id in set(trained)
        )
        assert max(trained_slots.values()) == 1 and per_slot
        # The window kept in-flight work small: little was admitted and then thrown away.
        assert f["evicted"][0] <= 3 * B
    finally:
        redis_proc.stop()


def _weights(v: int) -> common_pb2.ActorWeightState:
    from .helpers import weights

    return weights(v)
