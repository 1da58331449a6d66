"""Membership and version inputs of routing: resource-manager listings and ledger commands, applied."""

from __future__ import annotations

import pytest

from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as ledger
from rollart.v1 import llmproxy_pb2 as pp
from rollart.v1 import resource_manager_pb2 as rm
from rollart_llmproxy.config import LLMProxyConfig
from rollart_llmproxy.core import Proxy
from rollart_llmproxy.membership import LedgerWatch, ResourceManagerSync
from rollart_llmproxy.router import PoolInfo

PK = common_pb2.PoolKind


@pytest.fixture
async def proxy():
    p = Proxy(
        LLMProxyConfig(
            insecure_disable_auth=True,
            http_listen=None,
            resource_manager="127.0.0.1:1",
            actors=[{"actor_id": "static-1", "endpoint": "127.0.0.1:2", "pool": "cpu"}],
        )
    )
    yield p
    await p.stop()


def worker(wid: str, pool: str, pd_role: str = "", state=rm.WORKER_STATE_ALIVE, tags=()) -> rm.Worker:
    return rm.Worker(
        worker_id=wid,
        role="actor",
        endpoint=f"127.0.0.1:{abs(hash(wid)) % 5000 + 10000}",
        pool=pool,
        state=state,
        hardware=common_pb2.Hardware(tags=list(tags)),
        labels={"pd_role": pd_role} if pd_role else {},
    )


async def test_resource_manager_listing_becomes_actors_pools_and_binding_rules(proxy):
    sync = ResourceManagerSync(proxy, "127.0.0.1:1")
    assert not proxy.synced  # with a resource manager configured: not final until the first listing
    pools = [
        rm.Pool(name="h20", kind=PK.POOL_KIND_GPU_BANDWIDTH),
        rm.Pool(name="h800", kind=PK.POOL_KIND_GPU_COMPUTE, fallback_pools=["h20"]),
    ]
    workers = [
        worker("d1", "h20", "decode", tags=["decode"]),
        worker("p1", "h800", "prefill"),
        worker("gone", "h20", state=rm.WORKER_STATE_EXPIRED),
    ]
    bindings = [
        rm.Binding(
            binding_id="decoders",
            role="actor",
            workers=[rm.BoundWorker(worker_id="d1", pool="h20")],
            request=rm.BindRequest(binding_id="decoders", affinity_tag="gem:*", allow_fallback=True),
        )
    ]
    sync.apply(pools, workers, bindings)
    actors = proxy.router.actors
    assert set(actors) == {"static-1", "d1", "p1"}
    assert actors["d1"].binding_ids == {"decoders"} and actors["d1"].pd_role == common_pb2.PD_ROLE_DECODE
    assert actors["p1"].pd_role == common_pb2.PD_ROLE_PREFILL and actors["p1"].from_rm
    assert proxy.router.pools["h800"] == PoolInfo(PK.POOL_KIND_GPU_COMPUTE, ("h20",), False)
    rule = proxy.router.rule_for("gem:game:Sokoban")
    assert rule.binding_id == "decoders" and rule.allow_fallback
    table = proxy.affinity_table()
    assert [(r.task, r.from_binding) for r in table.rules] == [("gem:*", True)]
    # An explicit rule for the same tag hides the derived one; SetAffinity ignores output-only rules.
    proxy.set_affinity([pp.AffinityRule(task="gem:*", pool="h800"), *table.rules], merge=True)
    assert [(r.task, r.pool, r.from_binding) for r in proxy.affinity_table().rules] == [("gem:*", "h800", False)]
    assert proxy.synced

    # d1 leaves; the static actor stays although the resource manager never listed it.
    sync.apply(pools, [worker("p1", "h800", "prefill")], [])
    assert set(actors) == {"static-1", "p1"} and "d1" in proxy.router.graveyard
    assert proxy.router.derived_rules == {}
    # Removed by hand: a later listing does not bring it back.
    proxy.remove_actor("p1", abort_in_flight=True)
    sync.apply(pools, [worker("p1", "h800", "prefill")], [])
    assert "p1" not in actors
    await sync.channel.close()


async def test_a_rule_naming_no_pool_without_fallback_is_refused_once_synced(proxy):
    from rollart_llmproxy.core import TurnError

    rule = pp.AffinityRule(task="math", pool="h100", allow_fallback=False)
    proxy.set_affinity([rule], merge=True)  # before the first listing nobody knows the pools yet: accepted
    sync = ResourceManagerSync(proxy, "127.0.0.1:1")
    sync.apply([rm.Pool(name="h20", kind=PK.POOL_KIND_GPU_BANDWIDTH)], [], [])
    with pytest.raises(TurnError, match=r"rules\[0\]\.pool: no pool named 'h100'"):
        proxy.set_affinity([rule], merge=True)
    proxy.set_affinity([pp.AffinityRule(task="math", pool="h100", allow_fallback=True)], merge=True)
    proxy.set_affinity([pp.AffinityRule(task="math", pool="h20", allow_fallback=False)], merge=True)
    with pytest.raises(TurnError, match=r"rules\[0\]: auto"):
        proxy.set_affinity([pp.AffinityRule(task="*", auto=True, pool_kind=PK.POOL_KIND_CPU)], merge=True)
    await sync.channel.close()


class _FakeLedger:
    """Stands in for the ledger stub (GetJobPolicy only)."""

    def __init__(self, policy: ledger.JobPolicy) -> None:
        self.policy = policy

    async def GetJobPolicy(self, request, **kw):  # noqa: N802 - gRPC method name
        return self.policy


async def test_step_plans_move_the_window_and_cancellations_abort(proxy):
    watch = LedgerWatch(proxy, "127.0.0.1:1", "llmproxy")
    watch.stub = _FakeLedger(ledger.JobPolicy(admission=common_pb2.ADMISSION_POLICY_BOUNDED, alpha=2))
    plan = ledger.StepPlan(step=4, version=7, allocations=[ledger.ActorAllocation(actor_id="static-1", requests=12)])
    await watch.handle(ledger.LedgerCommand(sequence=3, step_planned=plan))
    assert proxy.plan_step == 4 and proxy.router.window.min_version == 5
    assert proxy.router.actors["static-1"].step_allocation == 12
    assert proxy.list_actors()[0].step_allocation == 12
    # An older plan arriving late changes nothing; STRICT means alpha 0.
    await watch.handle(ledger.LedgerCommand(sequence=4, step_planned=ledger.StepPlan(step=3, version=6)))
    assert proxy.router.window.min_version == 5
    watch.stub = _FakeLedger(ledger.JobPolicy(admission=common_pb2.ADMISSION_POLICY_STRICT, alpha=2))
    await watch.handle(ledger.LedgerCommand(sequence=5, step_planned=ledger.StepPlan(step=5, version=8)))
    assert proxy.router.window.min_version == 8 and proxy.status().plan_step == 5
    assert proxy.router.actors["static-1"].step_allocation == 0
    # Lease cancellations end the trajectories' turns (none in flight here: a no-op that must not fail).
    await watch.handle(
        ledger.LedgerCommand(
            sequence=6, cancel_leases=ledger.CancelLeasesCommand(lease_ids=["l"], trajectory_ids=["t"])
        )
    )
    await watch.channel.close()
