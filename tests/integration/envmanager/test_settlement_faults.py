"""Settlement when the ledger cannot be reached (a real rollart-ledger over a real redis-server, SIGKILLed and
started again on the same address): Submit is retried with backoff and lands once; when the ledger stays away
past the retry budget the trajectory is an infrastructure failure with its cause, never a rejection, and its
lease is released as soon as the ledger answers again."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from rollart.v1 import common_pb2, envmanager_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart_envmanager.config import EnvManagerConfig
from rollart_envmanager.episode import Episode
from rollart_envmanager.manager import Group, Loop, Manager
from tests.conftest import TOKEN
from tests.integration.ledger.conftest import start_ledger
from tests.integration.ledger.helpers import acquire, policy, prompts, trajectory, version, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ledger(services, redis_url, channel_factory, auth_md):
    from rollart.v1 import ledger_pb2_grpc as lg

    proc, address = start_ledger(services, redis_url)
    stub = lg.LedgerStub(channel_factory(address))
    policy(stub, auth_md, initial_lease_ttl=30.0)
    version(stub, auth_md, 0)
    prompts(stub, auth_md, 1, group_size=1, task="frozenlake")
    return SimpleNamespace(proc=proc, address=address, stub=stub, md=auth_md, redis_url=redis_url)


def _restart(services, ledger) -> None:
    proc, address = start_ledger(services, ledger.redis_url, ROLLART_LISTEN=ledger.address)
    assert address == ledger.address
    ledger.proc = proc


def _loop(address: str, **cfg) -> Loop:
    config = EnvManagerConfig(ledger=address, job_token=TOKEN, manager_id="em-test", rpc_timeout_seconds=2.0, **cfg)
    manager = Manager(config)
    req = envmanager_pb2.StartLoopsRequest(
        group_id="g", env=envmanager_pb2.EnvironmentSpec(environment="gymnasium:FrozenLake-v1"), count=1
    )
    group = Group(req, manager.task_config(req.env), "em-test/g", ["frozenlake"])
    return Loop(manager, group, 0)


def _settle(loop: Loop, lease: lp.Lease) -> tuple[str, common_pb2.Trajectory]:
    traj = trajectory(lease, scored=False)
    ep = Episode(traj.trajectory_id, loop.loop_id, "gymnasium:FrozenLake-v1", "frozenlake", lease=lease)

    async def run() -> str:
        scoring = asyncio.get_running_loop().create_future()
        scoring.cancel()  # no reward service here: nothing is recorded after the settlement
        try:
            out = await loop._settle(ep, SimpleNamespace(reward=common_pb2.RewardSpec()), traj, scoring)
            await asyncio.sleep(0)
            pending = [t for t in loop.m._tasks if not t.done()]
            if pending:  # the background release
                await asyncio.wait(pending, timeout=30)
            return out
        finally:
            await loop.m.peers.close()

    return asyncio.run(run()), traj


def test_submit_lands_once_after_the_ledger_comes_back(services, ledger):
    (lease,) = acquire(ledger.stub, ledger.md, "em-test/g/0")
    ledger.proc.kill()
    loop = _loop(ledger.address)
    timer = threading.Timer(1.5, _restart, (services, ledger))
    timer.start()
    t0 = time.monotonic()
    outcome, traj = _settle(loop, lease)
    timer.join()
    assert outcome == "ok", loop.last_error
    assert time.monotonic() - t0 >= 1.0  # it waited for the ledger
    c = loop.counters
    assert (c.admitted, c.rejected, c.infra_failures) == (1, 0, 0)
    st = ledger.stub.GetStatus(lp.LedgerStatusRequest(), metadata=ledger.md)
    assert st.settlement.admitted == 1 and not dict(st.settlement.rejected)
    # Idempotent: the same trajectory again gets the first answer and is not counted twice.
    again = ledger.stub.Submit(lp.SubmitRequest(trajectory=traj, holder="em-test/g/0"), metadata=ledger.md)
    assert again.admitted
    assert ledger.stub.GetStatus(lp.LedgerStatusRequest(), metadata=ledger.md).settlement.admitted == 1


def test_a_ledger_away_too_long_is_an_infra_failure_and_the_lease_is_released(services, ledger):
    (lease,) = acquire(ledger.stub, ledger.md, "em-test/g/0")
    ledger.proc.kill()
    loop = _loop(ledger.address, settle_retry_seconds=1.0, release_retry_seconds=30.0)
    # The ledger comes back after the settlement gave up, while the release is still being retried.
    timer = threading.Timer(3.0, _restart, (services, ledger))
    timer.start()
    lease.expires_at.FromSeconds(int(time.time()))  # settle only within the retry budget
    outcome, _ = _settle(loop, lease)
    timer.join()
    assert outcome == "ledger-unavailable"
    c = loop.counters
    assert (c.rejected, c.admitted, c.infra_failures, c.trajectories) == (0, 0, 1, 1)
    assert loop.m.failures["ledger-unavailable"] == 1
    assert "settlement failed" in loop.last_error
    got = wait_until(
        lambda: ledger.stub.GetLease(lp.GetLeaseRequest(lease_id=lease.lease_id), metadata=ledger.md), timeout=10
    )
    assert got.state == lp.LEASE_STATE_RELEASED and got.release_reason == lp.RELEASE_REASON_INFRA_FAILURE
    st = ledger.stub.GetStatus(lp.LedgerStatusRequest(), metadata=ledger.md)
    assert st.settlement.admitted == 0 and not dict(st.settlement.rejected)


def test_a_restarted_envmanager_releases_what_its_predecessor_held(services, ledger):
    """Same manager_id (as `rollart up` gives it): the new process's loop finds the lease its predecessor left
    under the same holder and gives it back at once instead of letting it expire."""
    (lease,) = acquire(ledger.stub, ledger.md, "em-test/g/0")
    loop = _loop(ledger.address)

    async def run() -> int:
        try:
            return await loop.m.reclaim(loop)
        finally:
            await loop.m.peers.close()

    assert asyncio.run(run()) == 1
    got = ledger.stub.GetLease(lp.GetLeaseRequest(lease_id=lease.lease_id), metadata=ledger.md)
    assert got.state == lp.LEASE_STATE_RELEASED and got.release_reason == lp.RELEASE_REASON_ABANDONED
    assert len(acquire(ledger.stub, ledger.md, "em-test/g/0")) == 1  # its sample is back in the pool
