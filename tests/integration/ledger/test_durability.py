"""SIGKILL the ledger (and then its redis-server) in the middle of settlement traffic, restart both: no
acknowledged admission is lost or counted twice; leases and versions are intact."""

from __future__ import annotations

import asyncio
import collections

import grpc

from rollart.local.processes import free_port, start_redis
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg

from .conftest import start_ledger
from .helpers import dur, policy, status, trajectory, version

CLIENTS = 8


def all_leases(s, md) -> list[lp.Lease]:
    out, token = [], ""
    while True:
        page = s.ListLeases(lp.ListLeasesRequest(page_size=1000, page_token=token), metadata=md)
        out.extend(page.leases)
        token = page.next_page_token
        if not token:
            return out


def test_sigkill_mid_settlement_loses_and_duplicates_nothing(services, tmp_path, channel_factory, auth_md):
    md = auth_md
    port = free_port()
    redis_proc, url = start_redis(tmp_path / "store", port=port)  # AOF, appendfsync always
    try:
        proc, address = start_ledger(services, url)
        s = lg.LedgerStub(channel_factory(address))
        policy(s, md, group_size=2)
        for v in range(2):
            version(s, md, v)
        s.AddPrompts(lp.AddPromptsRequest(prompts=[lp.Prompt(prompt_id=f"p{i}", task="math") for i in range(500)]), metadata=md)
        versions_before = s.ListVersions(lp.ListVersionsRequest(), metadata=md)

        acked: list[lp.SubmitResponse] = []
        acquired: list[str] = []

        async def client(i: int, stub: lg.LedgerStub) -> None:
            holder = f"env/{i}"
            try:
                while True:
                    resp = await stub.AcquireLeases(lp.AcquireLeasesRequest(holder=holder, max_leases=2), metadata=md, timeout=2)
                    acquired.extend(le.lease_id for le in resp.leases)
                    for lease in resp.leases:
                        t = trajectory(lease)
                        req = lp.SubmitRequest(trajectory=t, holder=holder, reward=common_pb2.RewardOutcome(reward=1.0))
                        verdict = await stub.Submit(req, metadata=md, timeout=2)
                        if verdict.admitted:
                            acked.append(verdict)
            except grpc.aio.AioRpcError:
                return  # the ledger is gone

        async def traffic() -> None:
            ch = grpc.aio.insecure_channel(address)
            stub = lg.LedgerStub(ch)
            tasks = [asyncio.create_task(client(i, stub)) for i in range(CLIENTS)]
            while len(acked) < 150:
                await asyncio.sleep(0.02)
            proc.kill()  # SIGKILL while submissions are in flight
            await asyncio.wait(tasks, timeout=10)
            await ch.close()

        asyncio.run(traffic())
        assert len(acked) >= 150
        # The store goes down hard as well, and comes back from its append-only file.
        redis_proc.kill()
        redis_proc, url2 = start_redis(tmp_path / "store", port=port)
        assert url2 == url
        _, address2 = start_ledger(services, url)
        s = lg.LedgerStub(channel_factory(address2))

        assert s.ListVersions(lp.ListVersionsRequest(), metadata=md) == versions_before
        leases = {le.lease_id: le for le in all_leases(s, md)}
        assert set(acquired) <= set(leases)  # every acknowledged lease is still there
        for v in acked:
            le = leases[v.lease.lease_id]
            assert le.state == lp.LEASE_STATE_SETTLED and le.trajectory_id == v.lease.trajectory_id
        settled = [le for le in leases.values() if le.state == lp.LEASE_STATE_SETTLED]
        slots = collections.Counter((le.group_id, le.sample_index) for le in settled)
        assert max(slots.values()) == 1  # no sample admitted twice
        assert max(collections.Counter(le.group_id for le in settled).values()) <= 2
        st = status(s, md)
        # Acknowledged ones are all there; at most the submissions in flight at the kill were added unseen.
        assert len(acked) <= st.settlement.admitted == len(settled) == st.buffer.samples <= len(acked) + CLIENTS * 2
        # Retrying an acknowledged submission after the restart is answered from the record, not counted again.
        first = acked[0]
        again = s.Submit(
            lp.SubmitRequest(trajectory=trajectory(leases[first.lease.lease_id], tid=first.lease.trajectory_id), holder=first.lease.holder),
            metadata=md,
        )
        assert again.admitted and again.duplicate
        assert status(s, md).settlement.admitted == st.settlement.admitted
        # And the restarted ledger keeps working: active leases from before expire or are settled normally.
        resp = s.AcquireLeases(lp.AcquireLeasesRequest(holder="env/after", wait=dur(1)), metadata=md)
        assert resp.leases and s.Submit(
            lp.SubmitRequest(trajectory=trajectory(resp.leases[0]), holder="env/after"), metadata=md
        ).admitted
    finally:
        redis_proc.stop()
