"""The LLMProxy gRPC service (rollart.v1.LLMProxy), plus the OpenAI HTTP API and membership tasks it runs."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import grpc
from grpc import aio

from rollart.discovery import Registration
from rollart.v1 import common_pb2
from rollart.v1 import llmproxy_pb2 as pp
from rollart.v1 import llmproxy_pb2_grpc as lg
from rollart.v1 import resource_manager_pb2 as rm

from . import validators
from .config import LLMProxyConfig
from .core import Proxy
from .membership import LedgerWatch, ResourceManagerSync, discover
from .openai_http import OpenAIServer

log = logging.getLogger(__name__)


def _wire(response: bytes | pp.TrajectoryGenerateResponse) -> bytes:
    """Generate's response serializer: forwarded responses arrive already encoded (``Proxy.generate_wire``)."""
    return response if isinstance(response, bytes) else response.SerializeToString()


class _Handlers:
    """Stands in for the server while the generated ``add_LLMProxyServicer_to_server`` registers the methods, so
    that Generate's response serializer can be replaced before the real server sees them."""

    name = ""
    handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, _handlers: object) -> None:
        pass  # registered below, from the same (patched) method table

    def add_registered_method_handlers(self, name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.name, self.handlers = name, handlers


class LLMProxyService(lg.LLMProxyServicer):
    name = "llmproxy"
    service_names = [pp.DESCRIPTOR.services_by_name["LLMProxy"].full_name]

    def __init__(self, cfg: LLMProxyConfig) -> None:
        self.cfg = cfg
        self.proxy: Proxy | None = None  # created in start(): it needs the running loop
        self.http: OpenAIServer | None = None
        self.registration: Registration | None = None
        self._tasks: list[asyncio.Task] = []

    @property
    def p(self) -> Proxy:
        assert self.proxy is not None
        return self.proxy

    def add_to_server(self, server: aio.Server) -> None:
        table = _Handlers()
        lg.add_LLMProxyServicer_to_server(self, table)
        generate = table.handlers["Generate"]
        assert generate.unary_stream is not None
        table.handlers["Generate"] = grpc.unary_stream_rpc_method_handler(
            generate.unary_stream, request_deserializer=generate.request_deserializer, response_serializer=_wire
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(table.name, table.handlers),))
        server.add_registered_method_handlers(table.name, table.handlers)

    async def start(self) -> None:
        self.proxy = Proxy(self.cfg)
        await self.proxy.start()
        if self.cfg.resource_manager:
            sync = ResourceManagerSync(self.proxy, self.cfg.resource_manager)
            self._tasks.append(asyncio.create_task(sync.run(), name="rm-sync"))
        if self.cfg.ledger or self.cfg.resource_manager:
            self._tasks.append(asyncio.create_task(self._follow_ledger(), name="ledger-watch"))
        if self.cfg.http_listen:
            self.http = OpenAIServer(self.proxy)
            address = await self.http.start(self.cfg.http_listen)
            self.proxy.openai_base_url = f"http://{address}/v1"
            log.info("OpenAI API serving", extra={"fields": {"base_url": self.proxy.openai_base_url}})

    async def _follow_ledger(self) -> None:
        """Watch the configured ledger, or the one the resource manager knows (role "ledger")."""
        address = self.cfg.ledger
        if address is None:
            assert self.cfg.resource_manager is not None
            address = await discover(self.cfg.resource_manager, "ledger", self.cfg)
        sub = self.cfg.ledger_subscriber_id or self.cfg.instance_name or "llmproxy"
        log.info("following the ledger", extra={"fields": {"ledger": address, "subscriber": sub}})
        await LedgerWatch(self.p, address, sub).run()

    async def stop(self) -> None:
        if self.registration is not None:
            await self.registration.stop()
        if self.http is not None:
            await self.http.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.proxy is not None:
            await self.proxy.stop()

    def ready_info(self) -> dict[str, Any]:
        if self.http is None:
            return {}
        return {"http_address": self.http.address, "openai_base_url": self.p.openai_base_url}

    async def on_serving(self, address: str) -> None:
        if not self.cfg.resource_manager:
            return
        labels = {"openai_base_url": self.p.openai_base_url} if self.http is not None else {}
        worker = rm.Worker(
            worker_id=self.cfg.instance_name or f"llmproxy-{socket.gethostname()}-{os.getpid()}",
            role="llmproxy",
            endpoint=address,
            pool=self.cfg.rm_pool,
            hardware=common_pb2.Hardware(accelerator="cpu", count=os.cpu_count() or 1),
            labels=labels,
            ttl_seconds=10.0,
        )
        pool = None
        if self.cfg.rm_register_pool:
            pool = rm.Pool(name=self.cfg.rm_pool, kind=common_pb2.POOL_KIND_CPU, capacity=8)
        self.registration = Registration(
            self.cfg.resource_manager, worker, token=self.cfg.token(), tls=self.cfg.tls, pool=pool
        )
        await self.registration.start()

    # --------------------------------------------------------------------------------------------- generation

    async def Generate(
        self, request: pp.TrajectoryGenerateRequest, context: aio.ServicerContext
    ) -> AsyncIterator[bytes | pp.TrajectoryGenerateResponse]:
        # A failed turn raises TurnError: the server's handler wrapper ends the stream with its status.
        # Encoded responses: the actor's chunks are forwarded as received (see _wire).
        async with aclosing(self.p.generate_wire(request, context.time_remaining())) as gen:
            async for resp in gen:
                yield resp

    async def Tokenize(self, request: pp.ProxyTokenizeRequest, context: aio.ServicerContext) -> Any:
        validators.tokenize(request)
        remaining = context.time_remaining()
        return await self.p.tokenize(request.task, request.request, min(remaining or 30.0, 30.0))

    # ------------------------------------------------------------------------------------------ step protocol

    async def Suspend(self, request: pp.SuspendRequest, context: aio.ServicerContext) -> pp.AdmissionState:
        validators.suspend(request)
        return self.p.suspend(request.reason, request.step, request.job_id)

    async def Resume(self, request: pp.ResumeRequest, context: aio.ServicerContext) -> pp.AdmissionState:
        validators.job_id(request.job_id)
        return self.p.resume(request.job_id)

    async def Abort(self, request: pp.ProxyAbortRequest, context: aio.ServicerContext) -> pp.ProxyAbortResponse:
        validators.abort(request)
        return self.p.abort(list(request.trajectory_ids), request.reason[:1000])

    async def SetVersionWindow(
        self, request: pp.SetVersionWindowRequest, context: aio.ServicerContext
    ) -> pp.VersionWindow:
        validators.job_id(request.job_id)
        return self.p.set_window(request.window, request.job_id)

    # ---------------------------------------------------------------------------------------- membership

    async def ListActors(
        self, request: pp.ListProxyActorsRequest, context: aio.ServicerContext
    ) -> pp.ListProxyActorsResponse:
        return pp.ListProxyActorsResponse(actors=self.p.list_actors(request.pool))

    async def AddActor(self, request: pp.AddProxyActorRequest, context: aio.ServicerContext) -> pp.ProxyActor:
        validators.add_actor(request)
        self.p.removed_by_hand.discard(request.actor_id)
        entry = self.p.add_actor(
            request.actor_id,
            request.endpoint,
            pool=request.pool,
            region=request.region,
            hardware=request.hardware,
            pd_role=request.pd_role or common_pb2.PD_ROLE_UNIFIED,
            static=True,
            poll=False,
        )
        # One status poll before answering, so that the reply (and the next turn) sees its state.
        client = self.p.clients.get(entry.actor_id)
        if client is not None:
            await self.p.poll_once(entry, client, timeout=min(self.cfg.status_timeout_seconds, 2.0))
        self.p._start_poller(entry.actor_id)
        return self.p.proxy_actor(entry, self.p.router.sticky_counts())

    async def RemoveActor(
        self, request: pp.RemoveProxyActorRequest, context: aio.ServicerContext
    ) -> common_pb2.Nothing:
        validators.check_id("actor_id", request.actor_id)
        self.p.remove_actor(request.actor_id, request.abort_in_flight)
        return common_pb2.Nothing()

    async def SetAffinity(self, request: pp.SetAffinityRequest, context: aio.ServicerContext) -> pp.AffinityTable:
        self.p.set_affinity(list(request.rules), request.merge)
        return self.p.affinity_table()

    async def GetAffinity(self, request: pp.GetAffinityRequest, context: aio.ServicerContext) -> pp.AffinityTable:
        return self.p.affinity_table()

    async def SetPdConfig(self, request: pp.SetPdConfigRequest, context: aio.ServicerContext) -> pp.PdRouting:
        self.p.set_pd(list(request.pools), request.merge)
        return self.p.pd_routing()

    async def GetPdConfig(self, request: pp.GetPdConfigRequest, context: aio.ServicerContext) -> pp.PdRouting:
        return self.p.pd_routing()

    async def GetStatus(self, request: pp.ProxyStatusRequest, context: aio.ServicerContext) -> pp.ProxyStatus:
        return self.p.status()
