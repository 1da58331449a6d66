"""Where the proxy learns about actors and versions: the resource manager (actor workers, their bindings and
pools; a Watch stream triggers resyncs) and the ledger's command stream (step plans, lease cancellations)."""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc import aio

from rollart.discovery import resource_manager_channel
from rollart.runtime.client import channel
from rollart.runtime.telemetry import log_fields
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as ledger
from rollart.v1 import ledger_pb2_grpc as ledger_grpc
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

from .core import PD_ROLE_NAMES, Proxy
from .router import UNHEALTHY, PoolInfo, Rule

log = logging.getLogger(__name__)


class ResourceManagerSync:
    """Keeps the proxy's actors equal to the resource manager's live workers of the actor role."""

    def __init__(self, proxy: Proxy, address: str) -> None:
        self.proxy = proxy
        self.cfg = proxy.cfg
        self.channel = resource_manager_channel(address, self.cfg.token(), self.cfg.tls)
        self.stub = rm_grpc.ResourceManagerStub(self.channel)
        self._dirty = asyncio.Event()
        self.revision = 0

    async def run(self) -> None:
        watcher = asyncio.create_task(self._watch(), name="rm-watch")
        try:
            backoff = 0.2
            while True:
                self._dirty.clear()
                try:
                    await self.resync()
                    backoff = 0.2
                except aio.AioRpcError as exc:
                    log.warning("resource manager resync failed", extra=log_fields(error=exc.details()))
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                try:
                    await asyncio.wait_for(self._dirty.wait(), self.cfg.resync_interval_seconds)
                except TimeoutError:
                    pass
                await asyncio.sleep(0.05)  # debounce a burst of events into one resync
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await self.channel.close()

    async def _watch(self) -> None:
        backoff = 0.2
        while True:
            try:
                call = self.stub.Watch(rm.WatchRequest(from_revision=self.revision), timeout=None)
                async for ev in call:
                    self.revision = ev.revision
                    self._dirty.set()
                    backoff = 0.2
            except aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
                    self.revision = 0
                self._dirty.set()
                log.info("resource manager watch ended", extra=log_fields(code=exc.code().name))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def resync(self) -> None:
        role = self.cfg.actor_role
        pools, workers, bindings = await asyncio.gather(
            self.stub.ListPools(rm.ListPoolsRequest()),
            self.stub.ListWorkers(rm.ListWorkersRequest(role=role)),
            self.stub.ListBindings(rm.ListBindingsRequest(role=role)),
        )
        self.apply(pools.pools, workers.workers, bindings.bindings)

    def apply(self, pools, workers, bindings) -> None:
        router = self.proxy.router
        router.pools = {p.name: PoolInfo(p.kind, tuple(p.fallback_pools), p.up) for p in pools}
        member_of: dict[str, set[str]] = {}
        derived: dict[str, Rule] = {}
        for b in bindings:
            for w in b.workers:
                member_of.setdefault(w.worker_id, set()).add(b.binding_id)
            tag = b.request.affinity_tag
            if tag:
                derived[tag] = Rule(task=tag, binding_id=b.binding_id, allow_fallback=b.request.allow_fallback)
        router.derived_rules = derived
        live = {}
        for w in workers:
            if w.state != rm.WORKER_STATE_ALIVE or w.worker_id in self.proxy.removed_by_hand:
                continue
            live[w.worker_id] = w
            role = PD_ROLE_NAMES.get(w.labels.get("pd_role", "").lower(), common_pb2.PD_ROLE_UNSPECIFIED)
            self.proxy.add_actor(
                w.worker_id,
                w.endpoint,
                pool=w.pool,
                region=w.region,
                hardware=w.hardware,
                pd_role=role,
                from_rm=True,
                binding_ids=member_of.get(w.worker_id, set()),
            )
        for actor_id, entry in list(router.actors.items()):
            if entry.from_rm and actor_id not in live:
                if entry.static:
                    entry.from_rm = False
                    entry.binding_ids = set()
                else:
                    log.info("actor left the resource manager", extra=log_fields(actor_id=actor_id))
                    # Deregistered while healthy: its in-flight turns finish. Expired while unhealthy (dead or
                    # hung): they would only wait for it, so they are cut and go elsewhere.
                    self.proxy.remove_actor(actor_id, abort_in_flight=entry.state == UNHEALTHY, by_hand=False)
        self.proxy.synced = True
        self.proxy.changed()


class LedgerWatch:
    """A ROUTER subscriber of the ledger's commands: step plans move the version window and set per-actor
    step allocations; lease cancellations abort the trajectories generating them."""

    def __init__(self, proxy: Proxy, address: str, subscriber_id: str) -> None:
        self.proxy = proxy
        self.cfg = proxy.cfg
        self.subscriber_id = subscriber_id
        self.channel = channel(
            address,
            token=self.cfg.token(),
            tls=self.cfg.tls,
            default_timeout=10.0,
            stream_timeout=None,
            idempotent=("rollart.v1.Ledger/GetStepPlan", "rollart.v1.Ledger/GetJobPolicy"),
        )
        self.stub = ledger_grpc.LedgerStub(self.channel)
        self.sequence = 0

    async def run(self) -> None:
        backoff = 0.2
        only_new = False
        try:
            while True:
                try:
                    req = ledger.WatchCommandsRequest(
                        subscriber_id=self.subscriber_id,
                        kind=ledger.SUBSCRIBER_KIND_ROUTER,
                        from_sequence=self.sequence,
                        only_new=only_new,
                    )
                    only_new = False
                    async for cmd in self.stub.WatchCommands(req, timeout=None):
                        self.sequence = max(self.sequence, cmd.sequence)
                        await self.handle(cmd)
                        backoff = 0.2
                except aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
                        # Commands were trimmed: take the current plan, then only new commands.
                        await self._latest_plan()
                        only_new = True
                    else:
                        log.info("ledger watch ended", extra=log_fields(code=exc.code().name, error=exc.details()))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
        finally:
            await self.channel.close()

    async def _latest_plan(self) -> None:
        try:
            plan = await self.stub.GetStepPlan(ledger.GetStepPlanRequest(step=0))
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                log.warning("GetStepPlan failed", extra=log_fields(error=exc.details()))
            return
        await self.apply_plan(plan)

    async def handle(self, cmd: ledger.LedgerCommand) -> None:
        kind = cmd.WhichOneof("command")
        if kind == "step_planned":
            await self.apply_plan(cmd.step_planned)
        elif kind == "cancel_leases":
            c = cmd.cancel_leases
            self.proxy.abort(list(c.trajectory_ids), reason="lease cancelled", lease_ids=list(c.lease_ids))

    async def apply_plan(self, plan: ledger.StepPlan) -> None:
        if plan.step < self.proxy.plan_step:
            return
        self.proxy.plan_step = plan.step
        allocations = {a.actor_id: a.requests for a in plan.allocations}
        for actor_id, entry in self.proxy.router.actors.items():
            entry.step_allocation = allocations.get(actor_id, 0)
        if self.cfg.follow_ledger_window:
            alpha = 0
            try:
                policy = await self.stub.GetJobPolicy(ledger.GetJobPolicyRequest())
                if policy.admission != common_pb2.ADMISSION_POLICY_STRICT:
                    alpha = policy.alpha
            except aio.AioRpcError as exc:
                log.warning("GetJobPolicy failed; window from the plan alone", extra=log_fields(error=exc.details()))
            window = self.proxy.router.window
            lo = max(plan.version - alpha, 0)
            hi = window.max_version if window.max_version >= lo else 0
            self.proxy.router.window = type(window)(min_version=lo, max_version=hi)
            self.proxy.changed()
        log.info(
            "step plan",
            extra=log_fields(step=plan.step, version=plan.version, window_min=self.proxy.router.window.min_version),
        )


async def discover(resource_manager: str, role: str, cfg) -> str:
    """The endpoint of a live worker of ``role`` at the resource manager; waits (with backoff) for one."""
    ch = resource_manager_channel(resource_manager, cfg.token(), cfg.tls)
    stub = rm_grpc.ResourceManagerStub(ch)
    backoff = 0.2
    try:
        while True:
            try:
                resp = await stub.ListWorkers(rm.ListWorkersRequest(role=role))
                for w in resp.workers:
                    if w.state == rm.WORKER_STATE_ALIVE and w.endpoint:
                        return w.endpoint
            except aio.AioRpcError as exc:
                log.info("discovery failed", extra=log_fields(role=role, error=exc.details()))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
    finally:
        await ch.close()
