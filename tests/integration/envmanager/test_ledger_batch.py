"""The envmanager's loops settle through batched ledger calls (AcquireLeasesBatch, SubmitBatch) against a real
rollart-ledger over a real redis-server: many loops take and settle leases in a few RPCs, each loop gets its own
answer (or its own refusal), a ledger SIGKILLed while batches are in flight loses and duplicates nothing, and
leases granted after their loop stopped waiting go back to the pool at once."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import grpc
import pytest
from grpc import aio

from rollart.v1 import envmanager_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg
from rollart_envmanager.config import EnvManagerConfig
from rollart_envmanager.manager import Group, LedgerError, Loop, Manager
from tests.conftest import TOKEN
from tests.integration.ledger.conftest import start_ledger
from tests.integration.ledger.helpers import policy, prompts, trajectory, version, wait_until

pytestmark = pytest.mark.timeout(120)
LOOPS = 48


@pytest.fixture
def ledger(services, redis_url, channel_factory, auth_md):
    proc, address = start_ledger(services, redis_url)
    stub = lg.LedgerStub(channel_factory(address))
    policy(stub, auth_md, initial_lease_ttl=60.0, min_lease_ttl=30.0)
    version(stub, auth_md, 0)
    return SimpleNamespace(proc=proc, address=address, stub=stub, md=auth_md, redis_url=redis_url)


def loops(address: str, n: int, **cfg) -> list[Loop]:
    config = EnvManagerConfig(ledger=address, job_token=TOKEN, manager_id="em-b", rpc_timeout_seconds=3.0,
                              lease_wait_seconds=1.0, **cfg)
    manager = Manager(config)
    req = envmanager_pb2.StartLoopsRequest(
        group_id="g", env=envmanager_pb2.EnvironmentSpec(environment="gymnasium:FrozenLake-v1"), count=n
    )
    group = Group(req, manager.task_config(req.env), "em-b/g", ["frozenlake"])
    return [Loop(manager, group, i) for i in range(n)]


def status(ledger) -> lp.LedgerStatus:
    return ledger.stub.GetStatus(lp.LedgerStatusRequest(), metadata=ledger.md)


def test_many_loops_take_and_settle_leases_in_few_rpcs(ledger):
    prompts(ledger.stub, ledger.md, LOOPS // 2, group_size=2, task="frozenlake")
    ls = loops(ledger.address, LOOPS)
    m = ls[0].m

    async def run():
        try:
            leases = await asyncio.gather(*(m.acquire(lo) for lo in ls))
            trajs = [trajectory(le, scored=False) for le in leases]
            verdicts = await asyncio.gather(*(m.submit(t, lo.holder, [], le) for t, lo, le in zip(trajs, ls, leases)))
            return leases, trajs, verdicts
        finally:
            await m.close()

    leases, trajs, verdicts = asyncio.run(run())
    assert [le.holder for le in leases] == [lo.holder for lo in ls]  # each loop its own lease
    assert len({le.lease_id for le in leases}) == LOOPS
    assert all(v.admitted and not v.duplicate for v in verdicts)
    assert [v.lease.trajectory_id for v in verdicts] == [t.trajectory_id for t in trajs]
    # Far fewer RPCs than calls: the calls made while one batch was in flight left together.
    assert m.ledger_calls.acquires.items == LOOPS and m.ledger_calls.acquires.batches <= LOOPS // 4
    assert m.ledger_calls.submits.items == LOOPS and m.ledger_calls.submits.batches <= LOOPS // 4
    st = status(ledger)
    assert st.settlement.admitted == LOOPS and st.buffer.samples == LOOPS


def test_a_refused_item_fails_only_its_own_loop(ledger):
    prompts(ledger.stub, ledger.md, 2, group_size=2, task="frozenlake")
    ls = loops(ledger.address, 3)
    m = ls[0].m

    async def run():
        try:
            leases = await asyncio.gather(*(m.acquire(lo) for lo in ls))
            good = [trajectory(le, scored=False) for le in leases]
            reused = trajectory(leases[2], tid=good[0].trajectory_id, scored=False)  # another lease's trajectory id
            await m.submit(good[0], ls[0].holder, [], leases[0])
            return await asyncio.gather(
                m.submit(good[1], ls[1].holder, [], leases[1]),
                m.submit(reused, ls[2].holder, [], leases[2]),
                return_exceptions=True,
            )
        finally:
            await m.close()

    ok, refused = asyncio.run(run())
    assert isinstance(ok, lp.SubmitResponse) and ok.admitted
    assert isinstance(refused, LedgerError) and not refused.unreachable and "ALREADY_EXISTS" in str(refused)
    assert status(ledger).settlement.admitted == 2


def test_sigkill_of_the_ledger_while_batches_are_in_flight_loses_and_duplicates_nothing(services, ledger):
    prompts(ledger.stub, ledger.md, LOOPS // 2, group_size=2, task="frozenlake")
    ls = loops(ledger.address, LOOPS, settle_retry_seconds=30.0)
    m = ls[0].m
    restarted = threading.Event()

    def restart():
        proc, address = start_ledger(services, ledger.redis_url, ROLLART_LISTEN=ledger.address)
        assert address == ledger.address
        ledger.proc = proc
        restarted.set()

    async def run():
        try:
            leases = await asyncio.gather(*(m.acquire(lo) for lo in ls))
            trajs = [trajectory(le, scored=False) for le in leases]
            submits = [asyncio.ensure_future(m.submit(t, lo.holder, [], le)) for t, lo, le in zip(trajs, ls, leases)]
            await asyncio.sleep(0)  # the first batch is on its way
            ledger.proc.kill()  # SIGKILL with the batches in flight or queued
            threading.Timer(1.0, restart).start()
            verdicts = await asyncio.gather(*submits)
            return trajs, verdicts
        finally:
            await m.close()

    trajs, verdicts = asyncio.run(run())
    assert restarted.is_set()
    assert all(v.admitted for v in verdicts)
    st = status(ledger)
    assert st.settlement.admitted == LOOPS == st.buffer.samples  # each settled exactly once
    for t in trajs:
        le = ledger.stub.GetLease(lp.GetLeaseRequest(lease_id=t.lease_id), metadata=ledger.md)
        assert le.state == lp.LEASE_STATE_SETTLED and le.trajectory_id == t.trajectory_id


def test_leases_granted_after_their_loop_gave_up_go_back_to_the_pool(ledger):
    lo, other, first = loops(ledger.address, 3)
    m = lo.m
    m.ledger_calls.acquires.max_in_flight = 1

    async def run():
        try:
            # While a first batch waits (the pool is empty), two calls queue up and leave together: the first of
            # them gives up early, the second waits on.
            blocker = asyncio.ensure_future(
                m.ledger_calls.acquire(lp.AcquireLeasesRequest(holder=first.holder), wait=0.3, timeout=5))
            await asyncio.sleep(0)
            req = lp.AcquireLeasesRequest(holder=lo.holder, tasks=["frozenlake"])
            call = asyncio.ensure_future(m.ledger_calls.acquire(req, wait=3.0, timeout=0.5))
            req2 = lp.AcquireLeasesRequest(holder=other.holder, tasks=["frozenlake"])
            call2 = asyncio.ensure_future(m.ledger_calls.acquire(req2, wait=3.0, timeout=8.0))
            with pytest.raises(aio.AioRpcError) as exc:
                await call
            assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert not (await blocker).leases
            assert m.ledger_calls.acquires.batches == 2
            # One sample: the first request of the batch takes it, for a loop that no longer waits.
            await asyncio.to_thread(prompts, ledger.stub, ledger.md, 1, group_size=1, task="frozenlake")
            assert not (await call2).leases
            await asyncio.sleep(0.5)
        finally:
            await m.close()

    asyncio.run(run())
    leases = wait_until(lambda: [le for le in ledger.stub.ListLeases(lp.ListLeasesRequest(), metadata=ledger.md).leases
                                 if le.state != lp.LEASE_STATE_ACTIVE], timeout=5)
    assert len(leases) == 1 and leases[0].state == lp.LEASE_STATE_RELEASED
    assert leases[0].holder == lo.holder
    assert status(ledger).leases.pending == 1  # its sample is back in the pool
