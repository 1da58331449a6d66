"""The actor's ledger agent against a real rollart-ledger (over a real redis-server), without an engine.

The actor side is a small in-memory ``ActorCommands`` (a version number and counters): what is under test
is the agent's protocol with the ledger: registration, heartbeats and tokens/s, Commit(v) from a planned
step acknowledged with the new weight state, re-registration after the ledger forgot the actor, leaving.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import grpc

from rollart.runtime.auth import bearer
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg
from rollart_actor.ledger_agent import ActorReport, LedgerAgent
from tests.conftest import TOKEN
from tests.integration.ledger.conftest import start_ledger
from tests.integration.ledger.helpers import h, policy, version, weights

MD = [bearer(TOKEN)]


class Actor:
    """What the agent drives: one active version (with v+1 staged), throughput, drain, relay."""

    def __init__(self, actor_id: str) -> None:
        self.actor_id = actor_id
        self.active = 1
        self.tokens = 0
        self.draining = False
        self.relay = ""
        self.registrations = 0
        self.commits: list[common_pb2.CommitOrder] = []
        self.cancelled: list[str] = []
        self.refuse = ""

    def weight_state(self) -> common_pb2.ActorWeightState:
        return weights(self.active, staged=(self.active + 1,))

    def ledger_actor(self) -> lp.LedgerActor:
        self.registrations += 1
        return lp.LedgerActor(
            actor_id=self.actor_id, endpoint="127.0.0.1:7001", region="us", weights=self.weight_state()
        )

    def report(self) -> ActorReport:
        self.tokens += 500  # 500 tokens between heartbeats
        return ActorReport(self.weight_state(), self.tokens, in_flight_requests=3, draining=self.draining)

    async def commit(self, order: common_pb2.CommitOrder) -> str:
        self.commits.append(order)
        if self.refuse:
            return self.refuse
        assert order.hash == h(order.version)
        self.active = order.version
        return ""

    async def cancel_leases(self, trajectory_ids: Sequence[str]) -> str:
        self.cancelled.extend(trajectory_ids)
        return ""

    async def set_draining(self, draining: bool) -> str:
        self.draining = draining
        return ""

    async def switch_relay(self, endpoint: str) -> str:
        self.relay = endpoint
        return "" if endpoint else "no endpoint"


async def until(pred, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_registers_heartbeats_commits_a_planned_step_reregisters_and_leaves(services, redis_url) -> None:
    _, address = start_ledger(services, redis_url)
    ch = grpc.aio.insecure_channel(address)
    stub = lg.LedgerStub(ch)
    policy_stub = lg.LedgerStub(grpc.insecure_channel(address))
    policy(policy_stub, MD, initial_tau=1_000_000.0)  # heartbeats must replace this prior
    for v in range(3):
        version(policy_stub, MD, v)
    actor = Actor("actor-agent-1")
    agent = LedgerAgent(endpoint=address, actor_id=actor.actor_id, actor=actor, token=TOKEN, heartbeat_seconds=0.2)
    agent.start()
    try:
        await agent.wait_registered(20)

        async def seen() -> bool:
            a = await stub.GetActor(lp.GetActorRequest(actor_id=actor.actor_id), metadata=MD)
            return agent.heartbeats >= 2 and a.weights.active_version == 1

        await until(seen)  # heartbeats carry the weight state and tokens/s
        a = await stub.GetActor(lp.GetActorRequest(actor_id=actor.actor_id), metadata=MD)
        assert a.endpoint == "127.0.0.1:7001" and a.liveness == lp.ACTOR_LIVENESS_ALIVE
        assert 100 < a.tau < 2600, a.tau  # ~500 tokens per 0.2 s heartbeat, as observed by the agent

        # Step 1 on v2: the actor has v2 staged, so the ledger orders Commit(2); the agent acknowledges it
        # with the state after it, and the step counts as committed.
        plan = await stub.PlanStep(lp.PlanStepRequest(step=1, version=2, batch_size=10), metadata=MD)
        [alloc] = plan.allocations
        assert alloc.actor_id == actor.actor_id and alloc.needs_commit
        done = await stub.AwaitStepCommitted(
            lp.AwaitStepCommittedRequest(step=1, wait=_dur(20)), metadata=MD, timeout=30
        )
        assert done.all_committed and [o.version for o in actor.commits] == [2] and actor.active == 2
        assert actor.commits[0].order_id == alloc.commit_order_id
        # A commit the actor refuses is acknowledged as failed, with its reason.
        version(policy_stub, MD, 3)
        actor.refuse = "FAILED_PRECONDITION: no staged delta is based on v2"
        await stub.PlanStep(lp.PlanStepRequest(step=2, version=3, batch_size=10), metadata=MD)

        async def refused() -> bool:
            p = await stub.GetStepPlan(lp.GetStepPlanRequest(step=2), metadata=MD)
            return bool(p.allocations and p.allocations[0].commit_error)

        await until(refused)
        p = await stub.GetStepPlan(lp.GetStepPlanRequest(step=2), metadata=MD)
        assert p.allocations[0].commit_error == actor.refuse and not p.all_committed and actor.active == 2
        actor.refuse = ""

        # The ledger forgets the actor (it left, or was presumed dead): the next heartbeat registers again.
        before = actor.registrations
        await stub.LeaveActor(lp.LeaveActorRequest(actor_id=actor.actor_id, reason="test"), metadata=MD)

        async def back() -> bool:
            if actor.registrations == before:
                return False
            a = await stub.GetActor(lp.GetActorRequest(actor_id=actor.actor_id), metadata=MD)
            return a.liveness == lp.ACTOR_LIVENESS_ALIVE and a.weights.active_version == 2

        await until(back)

        # Commands the agent hands over as they come (orders for other actors are not this one's).
        other = lp.LedgerCommand(sequence=10**9, commit=common_pb2.CommitOrder(version=3, actor_ids=["someone"]))
        await agent.handle(other)
        await agent.handle(lp.LedgerCommand(drain=lp.DrainCommand()))
        assert actor.draining and len(actor.commits) == 2
        await agent.handle(lp.LedgerCommand(undrain=lp.UndrainCommand()))
        await agent.handle(lp.LedgerCommand(cancel_leases=lp.CancelLeasesCommand(trajectory_ids=["t1", "t2"])))
        await agent.handle(lp.LedgerCommand(switch_relay=lp.SwitchRelayCommand(endpoint="127.0.0.1:7777")))
        assert not actor.draining and actor.cancelled == ["t1", "t2"] and actor.relay == "127.0.0.1:7777"
    finally:
        await agent.stop()
    # Stopping leaves the ledger.
    a = await stub.GetActor(lp.GetActorRequest(actor_id=actor.actor_id), metadata=MD)
    assert a.liveness == lp.ACTOR_LIVENESS_LEFT
    await ch.close()


def _dur(seconds: float):  # type: ignore[no-untyped-def]
    from google.protobuf.duration_pb2 import Duration

    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d
