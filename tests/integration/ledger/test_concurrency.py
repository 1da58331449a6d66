"""32 concurrent clients taking, settling, abandoning and losing leases while a trainer consumes batches.

Afterwards every group holds each of its samples exactly once, every admitted result was admitted once, and no
sample was ever leased to two holders at the same time. Runs ~10 s; ROLLART_SOAK=1 runs it for a minute.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import time

import grpc
import pytest

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg

from .helpers import dur, policy, status, trajectory, version

CLIENTS = 32
G, REDUNDANCY = 4, 1
DURATION = 60.0 if os.environ.get("ROLLART_SOAK") == "1" else 10.0


@pytest.mark.slow
def test_32_clients_exactly_once_and_never_two_holders(ledger):
    s, md = ledger.stub, ledger.md
    policy(s, md, group_size=G, redundancy=REDUNDANCY, initial_lease_ttl=2.0, min_lease_ttl=1.0, max_lease_attempts=1000)
    version(s, md, 0)
    acquired: list[tuple[str, str]] = []  # (lease id, holder)
    verdicts: list[tuple[str, lp.SubmitResponse]] = []  # (kind, verdict)
    consumed: list[lp.Batch] = []
    rng = random.Random(7)

    async def client(i: int, stub: lg.LedgerStub, stop: float) -> None:
        holder = f"env-{i // 8}/loop-{i}"
        while time.monotonic() < stop:
            try:
                resp = await stub.AcquireLeases(lp.AcquireLeasesRequest(holder=holder, wait=dur(0.3)), metadata=md, timeout=10)
            except grpc.aio.AioRpcError:
                continue
            for lease in resp.leases:
                acquired.append((lease.lease_id, holder))
                roll = rng.random()
                t = trajectory(lease)
                req = lp.SubmitRequest(trajectory=t, holder=holder, reward=common_pb2.RewardOutcome(reward=1.0))
                if roll < 0.12:  # abandon it
                    await stub.ReleaseLease(lp.ReleaseLeaseRequest(lease_id=lease.lease_id, holder=holder), metadata=md)
                    continue
                if roll < 0.14:  # hold it past its expiry, then submit late
                    await asyncio.sleep((lease.expires_at.ToMilliseconds() - lease.issued_at.ToMilliseconds()) / 1000 + 0.2)
                    verdicts.append(("late", await stub.Submit(req, metadata=md)))
                    continue
                if roll < 0.20:  # another holder tries to settle it first
                    wrong = lp.SubmitRequest(trajectory=trajectory(lease), holder=f"thief-{i}")
                    verdicts.append(("thief", await stub.Submit(wrong, metadata=md)))
                await asyncio.sleep(rng.random() * 0.02)  # "generation"
                verdicts.append(("first", await stub.Submit(req, metadata=md)))
                if roll > 0.9:  # a retry of the same result
                    verdicts.append(("retry", await stub.Submit(req, metadata=md)))

    async def trainer(stub: lg.LedgerStub, stop: float) -> None:
        step, added = 0, 0
        while time.monotonic() < stop:
            st = await stub.GetStatus(lp.LedgerStatusRequest(), metadata=md)
            if st.leases.pending < 400:
                prompts = [lp.Prompt(prompt_id=f"p{added + j}", task="math") for j in range(100)]
                await stub.AddPrompts(lp.AddPromptsRequest(prompts=prompts), metadata=md)
                added += 100
            step += 1
            try:
                batch = await stub.GetBatch(lp.GetBatchRequest(step=step, batch_size=4 * G, wait=dur(0.5)), metadata=md)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                continue
            consumed.append(batch)
            await stub.AckBatch(lp.AckBatchRequest(step=step, batch_id=batch.batch_id), metadata=md)

    async def main() -> None:
        channels = [grpc.aio.insecure_channel(ledger.address) for _ in range(4)]
        stubs = [lg.LedgerStub(c) for c in channels]
        stop = time.monotonic() + DURATION
        await stubs[0].AddPrompts(
            lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id=f"seed{j}", task="math") for j in range(200)]), metadata=md
        )
        await asyncio.gather(trainer(stubs[0], stop), *(client(i, stubs[i % 4], stop) for i in range(CLIENTS)))
        for c in channels:
            await c.close()

    asyncio.run(main())

    # ---- client side: no lease handed out twice, verdicts consistent
    ids = [lid for lid, _ in acquired]
    assert len(ids) == len(set(ids)) and len(ids) > 200
    firsts = [v for kind, v in verdicts if kind == "first"]
    retries = [v for kind, v in verdicts if kind == "retry"]
    admitted = [v for v in firsts if v.admitted]
    assert all(v.duplicate for v in retries)
    assert all(v.reason == lp.REJECTION_REASON_WRONG_HOLDER for kind, v in verdicts if kind == "thief")
    late = [v for kind, v in verdicts if kind == "late"]
    assert all(
        v.reason in (lp.REJECTION_REASON_EXPIRED, lp.REJECTION_REASON_CANCELLED) for v in late
    ), {lp.RejectionReason.Name(v.reason) for v in late}
    assert all(
        v.reason in (lp.REJECTION_REASON_EXPIRED, lp.REJECTION_REASON_CANCELLED) for v in firsts if not v.admitted
    )

    # ---- server side, every lease ever issued
    leases: list[lp.Lease] = []
    token = ""
    while True:
        page = s.ListLeases(lp.ListLeasesRequest(page_size=1000, page_token=token), metadata=md)
        leases.extend(page.leases)
        token = page.next_page_token
        if not token:
            break
    assert sorted(le.lease_id for le in leases) == sorted(ids)
    by_slot: dict[tuple[str, int], list[lp.Lease]] = collections.defaultdict(list)
    for le in leases:
        by_slot[(le.group_id, le.sample_index)].append(le)
    for slot, history in by_slot.items():
        history.sort(key=lambda x: x.issued_at.ToMilliseconds())
        assert sum(le.state == lp.LEASE_STATE_ACTIVE for le in history) <= 1, slot
        for prev, nxt in zip(history, history[1:]):
            # The next lease of a sample is issued only once the previous one ended: never two holders at once.
            assert prev.HasField("ended_at") and nxt.issued_at.ToMilliseconds() >= prev.ended_at.ToMilliseconds(), slot
        assert sum(le.state == lp.LEASE_STATE_SETTLED for le in history) <= 1, slot
    settled = [le for le in leases if le.state == lp.LEASE_STATE_SETTLED]
    assert sorted(le.lease_id for le in settled) == sorted(v.lease.lease_id for v in admitted)
    per_group = collections.Counter(le.group_id for le in settled)
    assert max(per_group.values()) <= G

    st = status(s, md)
    assert st.settlement.admitted == len(admitted) and st.settlement.duplicates == len(retries)
    in_batches = [t for b in consumed for g in b.groups for t in g.trajectories]
    assert len({t.trajectory_id for t in in_batches}) == len(in_batches)
    for b in consumed:
        assert all(len(g.trajectories) == G for g in b.groups)
        for g in b.groups:
            assert sorted(t.sample_index for t in g.trajectories) == sorted({t.sample_index for t in g.trajectories})
            assert per_group[g.group_id] == G
    # Every admitted sample is either still buffered or was trained on, exactly once.
    assert st.buffer.samples + len(in_batches) == len(admitted)
    assert {t.trajectory_id for t in in_batches} <= {v.lease.trajectory_id for v in admitted}
    complete = [gid for gid, n in per_group.items() if n == G]
    assert len(complete) >= len(in_batches) // G and st.leases.active <= CLIENTS
    print(
        f"{DURATION:.0f}s: {len(ids)} leases, {len(admitted)} admitted, {len(retries)} duplicates, "
        f"{st.leases.expired} expired, {st.leases.cancelled} cancelled, {len(in_batches)} trained on"
    )
