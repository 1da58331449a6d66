"""What the services say at the end of a ``rollart run`` (``summary.json`` "final"): the actors' versions and
hashes next to the ledger's and the trainer's, settlement and lease counters, the envmanager's counters, each
task's routing. Each part is best effort: a service that does not answer leaves its part out."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from google.protobuf.json_format import MessageToDict
from grpc import aio

from rollart.runtime.client import channel
from rollart.v1 import (
    envmanager_pb2,
    envmanager_pb2_grpc,
    ledger_pb2,
    ledger_pb2_grpc,
    llmproxy_pb2,
    llmproxy_pb2_grpc,
    trainer_pb2,
    trainer_pb2_grpc,
)

from .task_checks import rule_text

T = trainer_pb2


async def lease_census(stub: ledger_pb2_grpc.LedgerStub) -> dict[str, Any]:
    """Every lease the ledger still lists, by state, and whether a slot or a trajectory was settled twice."""
    by_state: dict[str, int] = {}
    slots: list[tuple[str, int]] = []
    trajectories: list[str] = []
    token = ""
    while True:
        page = await stub.ListLeases(ledger_pb2.ListLeasesRequest(page_size=1000, page_token=token))
        for le in page.leases:
            name = ledger_pb2.LeaseState.Name(le.state).removeprefix("LEASE_STATE_").lower()
            by_state[name] = by_state.get(name, 0) + 1
            if le.state == ledger_pb2.LEASE_STATE_SETTLED:
                slots.append((le.group_id, le.sample_index))
                trajectories.append(le.trajectory_id)
        token = page.next_page_token
        if not token:
            break
    return {
        "leases_listed": by_state,
        "settled_slots": len(slots),
        "settled_distinct_slots": len(set(slots)),
        "settled_distinct_trajectories": len(set(trajectories)),
    }


async def quiet_census(stub: ledger_pb2_grpc.LedgerStub, st: ledger_pb2.LedgerStatus) -> dict[str, Any]:
    """The lease counters and a census taken while they stood still (a few tries; the last one otherwise)."""
    census: dict[str, Any] = {}
    for _ in range(10):
        census = await lease_census(stub)
        after = await stub.GetStatus(ledger_pb2.LedgerStatusRequest(versions_limit=1))
        if after.leases == st.leases:
            break
        st = after
        await asyncio.sleep(0.5)
    counts = MessageToDict(st.leases, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return {"lease_counts": counts, **census}


async def final_state(services: dict[str, Any], token: str) -> dict[str, Any]:
    """What ``services`` (the local cluster's, by name) say now."""
    svc = services
    final: dict[str, Any] = {}
    with contextlib.suppress(aio.AioRpcError, KeyError):
        ch = channel(svc["ledger"]["address"], token=token, default_timeout=10.0)
        try:
            stub = ledger_pb2_grpc.LedgerStub(ch)
            st = await stub.GetStatus(ledger_pb2.LedgerStatusRequest(include_inactive_actors=True))
            vers = await stub.ListVersions(ledger_pb2.ListVersionsRequest(from_version=0, limit=10_000))
            final["ledger"] = {
                "latest_version": st.latest_version,
                "current_version": st.current_version,
                "versions": {str(v.version): v.hash.hex() for v in vers.versions},
                "admitted": st.settlement.admitted,
                "rejected": dict(st.settlement.rejected),
                "buffer_reserved": st.buffer.reserved_samples,
                "accounting": MessageToDict(st.accounting, preserving_proto_field_name=True),
                "duplicates": st.settlement.duplicates,
                # The ledger's lease counters next to its leases listed one by one (fault checks), from one
                # quiet moment: leases still move (aborted loops release theirs after StopLoops answered), so
                # the census counts only when the counters did not change while it listed.
                **await quiet_census(stub, st),
            }
            final["actors"] = {
                a.actor_id: {
                    "liveness": ledger_pb2.ActorLiveness.Name(a.liveness).removeprefix("ACTOR_LIVENESS_"),
                    "active_version": a.weights.active_version,
                    "active_hash": a.weights.active_hash.hex(),
                    "settled_tokens": a.settled_tokens,
                }
                for a in st.actors
            }
        finally:
            await ch.close()
    with contextlib.suppress(aio.AioRpcError, KeyError):
        ch = channel(svc["trainer"]["address"], token=token, default_timeout=30.0, idempotent=["rollart.v1.Trainer"])
        trainer = trainer_pb2_grpc.TrainerStub(ch)
        try:
            pub = await trainer.ListPublishedVersions(T.ListPublishedVersionsRequest(), timeout=10)
            ok = [p for p in pub.versions if p.state == T.PUBLISH_STATE_PUBLISHED]
            final["trainer"] = {
                "published": {str(p.version.version): p.version.hash.hex() for p in ok},
                "failed_publications": len(pub.versions) - len(ok),
            }
        finally:
            await ch.close()
    with contextlib.suppress(aio.AioRpcError, KeyError):
        ch = channel(svc["envmanager"]["address"], token=token, default_timeout=10.0)
        try:
            st = await envmanager_pb2_grpc.EnvManagerStub(ch).GetStatus(envmanager_pb2.EnvManagerStatusRequest())
            c = st.counters
            final["envmanager"] = {
                "trajectories": c.trajectories,
                "admitted": c.admitted,
                "rejected": c.rejected,
                "cancelled": c.cancelled,
                "infra_failures": c.infra_failures,
                "timeouts": c.timeouts,
                "turns": c.turns,
                "rewards_pending": st.rewards_pending,
                "failures_by_cause": dict(st.failures_by_cause),
            }
        finally:
            await ch.close()
    with contextlib.suppress(aio.AioRpcError, KeyError):
        # Each task's routing as the proxy saw it: its profile and the turns routed outside its affinity.
        ch = channel(svc["llmproxy"]["address"], token=token, default_timeout=10.0)
        try:
            table = await llmproxy_pb2_grpc.LLMProxyStub(ch).GetAffinity(llmproxy_pb2.GetAffinityRequest())
            final["llmproxy"] = {
                "rules": {r.task: rule_text(r) for r in table.rules},
                "profiles": {p.task: MessageToDict(p, preserving_proto_field_name=True) for p in table.profiles},
            }
        finally:
            await ch.close()
    return final
