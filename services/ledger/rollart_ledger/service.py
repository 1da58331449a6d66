"""The Ledger gRPC service (``rollart.v1.Ledger``) over Redis: a thin servicer.

Each RPC checks its request (``validators``), then calls the part of the core that owns it: ``control``
(policy, versions, actors, steps, commands), ``leases`` (prompts and leases), ``settlement`` (submissions,
rewards, batches) and ``status``, all over one ``store.Store``. Errors are raised, never mapped here: the
server's one mapper (``rollart.runtime.errors``) ends the call, including the core's ``LedgerError``. Every
state change is one atomic step in Redis, so several ledger processes may serve one store. See docs/ledger.md.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from grpc import aio

from rollart.discovery import Registration
from rollart.v1 import common_pb2
from rollart.v1 import ledger_pb2 as lp
from rollart.v1 import ledger_pb2_grpc as lg
from rollart.v1 import resource_manager_pb2 as rm

from . import validators
from .config import LedgerConfig
from .control import MAX_VERSION_STEP, Control
from .leases import Leases
from .settlement import Settlement
from .status import Status
from .store import Store, _HiredisPackingConnection

log = logging.getLogger(__name__)

__all__ = ["MAX_VERSION_STEP", "LedgerService", "_HiredisPackingConnection"]


class LedgerService(lg.LedgerServicer):
    name = "ledger"
    service_names = [lp.DESCRIPTOR.services_by_name["Ledger"].full_name]

    def __init__(self, cfg: LedgerConfig) -> None:
        self.cfg = cfg
        self.store = Store(cfg)
        self.control = Control(self.store)
        self.leases = Leases(self.store)
        self.settlement = Settlement(self.store)
        self.status = Status(self.store)
        self._registration: Registration | None = None

    # --------------------------------------------------------------------------------------------- lifecycle

    def add_to_server(self, server: aio.Server) -> None:
        lg.add_LedgerServicer_to_server(self, server)

    async def start(self) -> None:
        await self.store.start()

    async def on_serving(self, address: str) -> None:
        if not self.cfg.resource_manager:
            return
        worker = rm.Worker(
            worker_id=f"ledger-{self.cfg.job_id or 'default'}",
            role="ledger",
            endpoint=address,
            pool=self.cfg.rm_pool,
            hardware=common_pb2.Hardware(accelerator="cpu", count=1, tags=["ledger"]),
            ttl_seconds=10.0,
        )
        pool = rm.Pool(name=self.cfg.rm_pool, kind=common_pb2.POOL_KIND_CPU, capacity=64)
        self._registration = Registration(
            self.cfg.resource_manager, worker, token=self.cfg.token(), tls=self.cfg.tls, pool=pool
        )
        await self._registration.start()

    async def stop(self) -> None:
        if self._registration is not None:
            await self._registration.stop()
        await self.store.close()

    def _wait(self, seconds: float, context: aio.ServicerContext) -> float:
        return self.store.bounded_wait(seconds, context.time_remaining())

    # ------------------------------------------------------------------------------------- policy, versions

    async def SetJobPolicy(self, request: lp.SetJobPolicyRequest, context: aio.ServicerContext) -> lp.JobPolicy:
        validators.set_policy(request)
        return await self.control.set_policy(request)

    async def GetJobPolicy(self, request: lp.GetJobPolicyRequest, context: aio.ServicerContext) -> lp.JobPolicy:
        return await self.control.get_policy()

    async def RegisterVersion(
        self, request: lp.RegisterVersionRequest, context: aio.ServicerContext
    ) -> lp.RegisterVersionResponse:
        return await self.control.register_version(request, validators.register_version(request))

    async def GetVersion(
        self, request: lp.GetVersionRequest, context: aio.ServicerContext
    ) -> common_pb2.PolicyVersion:
        validators.get_version(request)
        return await self.control.get_version(request)

    async def ListVersions(
        self, request: lp.ListVersionsRequest, context: aio.ServicerContext
    ) -> lp.ListVersionsResponse:
        validators.list_versions(request)
        return await self.control.list_versions(request)

    # ------------------------------------------------------------------------------------------------ actors

    async def RegisterActor(
        self, request: lp.RegisterActorRequest, context: aio.ServicerContext
    ) -> lp.RegisterActorResponse:
        validators.register_actor(request)
        return await self.control.register_actor(request)

    async def ActorHeartbeat(
        self, request: lp.ActorHeartbeatRequest, context: aio.ServicerContext
    ) -> lp.ActorHeartbeatResponse:
        validators.heartbeat(request)
        return await self.control.heartbeat(request)

    async def LeaveActor(self, request: lp.LeaveActorRequest, context: aio.ServicerContext) -> lp.LeaveActorResponse:
        validators.actor_id(request.actor_id)
        return await self.control.leave_actor(request)

    async def GetActor(self, request: lp.GetActorRequest, context: aio.ServicerContext) -> lp.LedgerActor:
        validators.actor_id(request.actor_id)
        return await self.control.get_actor(request.actor_id)

    async def ListActors(self, request: lp.ListActorsRequest, context: aio.ServicerContext) -> lp.ListActorsResponse:
        return await self.control.list_actors(request)

    # -------------------------------------------------------------------------------------- steps, commands

    async def PlanStep(self, request: lp.PlanStepRequest, context: aio.ServicerContext) -> lp.StepPlan:
        validators.plan_step(request)
        return await self.control.plan_step(request)

    async def GetStepPlan(self, request: lp.GetStepPlanRequest, context: aio.ServicerContext) -> lp.StepPlan:
        validators.step(request.step)
        return await self.control.get_plan(request.step)

    async def AwaitStepCommitted(
        self, request: lp.AwaitStepCommittedRequest, context: aio.ServicerContext
    ) -> lp.StepPlan:
        wait = self._wait(validators.await_step_committed(request), context)
        return await self.control.await_step_committed(request.step, wait)

    async def WatchCommands(
        self, request: lp.WatchCommandsRequest, context: aio.ServicerContext
    ) -> AsyncIterator[lp.LedgerCommand]:
        validators.watch_commands(request)
        async for command in self.control.watch_commands(request):
            yield command

    async def AckCommand(self, request: lp.AckCommandRequest, context: aio.ServicerContext) -> lp.AckCommandResponse:
        validators.ack_command(request)
        return await self.control.ack_command(request)

    # ------------------------------------------------------------------------------------ prompts and leases

    async def AddPrompts(self, request: lp.AddPromptsRequest, context: aio.ServicerContext) -> lp.AddPromptsResponse:
        return await self.leases.add_prompts(request, validators.add_prompts(request))

    async def AcquireLeases(
        self, request: lp.AcquireLeasesRequest, context: aio.ServicerContext
    ) -> lp.AcquireLeasesResponse:
        args = validators.acquire_args(request)
        wait = self._wait(validators.duration("wait", request.wait), context)
        return await self.leases.acquire(args, wait)

    async def AcquireLeasesBatch(
        self, request: lp.AcquireLeasesBatchRequest, context: aio.ServicerContext
    ) -> lp.AcquireLeasesBatchResponse:
        args = validators.acquire_batch(request)
        wait = self._wait(validators.duration("wait", request.wait), context)
        return await self.leases.acquire_batch(args, wait)

    async def RenewLease(self, request: lp.RenewLeaseRequest, context: aio.ServicerContext) -> lp.RenewLeaseResponse:
        validators.lease(request.lease_id, request.holder)
        return await self.leases.renew(request)

    async def ReleaseLease(self, request: lp.ReleaseLeaseRequest, context: aio.ServicerContext) -> lp.Lease:
        validators.release_lease(request)
        return await self.leases.release(request)

    async def CancelLeases(
        self, request: lp.CancelLeasesRequest, context: aio.ServicerContext
    ) -> lp.CancelLeasesResponse:
        validators.cancel_leases(request)
        return await self.leases.cancel(request)

    async def GetLease(self, request: lp.GetLeaseRequest, context: aio.ServicerContext) -> lp.Lease:
        validators.lease_id(request.lease_id)
        return await self.leases.get_lease(request.lease_id)

    async def ListLeases(self, request: lp.ListLeasesRequest, context: aio.ServicerContext) -> lp.ListLeasesResponse:
        return await self.leases.list_leases(request, validators.list_leases(request))

    # -------------------------------------------------------------------------------------------- settlement

    async def Submit(self, request: lp.SubmitRequest, context: aio.ServicerContext) -> lp.SubmitResponse:
        tau_window_ms = int(self.cfg.tau_window_seconds * 1000)
        return await self.settlement.submit(validators.submission(request, tau_window_ms))

    async def SubmitBatch(
        self, request: lp.SubmitBatchRequest, context: aio.ServicerContext
    ) -> lp.SubmitBatchResponse:
        validators.submit_batch(request)
        return await self.settlement.submit_batch(request)

    async def RecordReward(
        self, request: lp.RecordRewardRequest, context: aio.ServicerContext
    ) -> lp.RecordRewardResponse:
        validators.record_reward(request)
        return await self.settlement.record_reward(request)

    async def ListUnscored(
        self, request: lp.ListUnscoredRequest, context: aio.ServicerContext
    ) -> lp.ListUnscoredResponse:
        return await self.settlement.list_unscored(request, *validators.list_unscored(request))

    async def GetBatch(self, request: lp.GetBatchRequest, context: aio.ServicerContext) -> lp.Batch:
        wait = self._wait(validators.get_batch(request), context)
        return await self.settlement.get_batch(request, wait)

    async def AckBatch(self, request: lp.AckBatchRequest, context: aio.ServicerContext) -> lp.AckBatchResponse:
        validators.ack_batch(request)
        return await self.settlement.ack_batch(request)

    # ------------------------------------------------------------------------------------------------ status

    async def GetStatus(self, request: lp.LedgerStatusRequest, context: aio.ServicerContext) -> lp.LedgerStatus:
        validators.status(request)
        return await self.status.status(request)
