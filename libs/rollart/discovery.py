"""Registering a process with the resource manager and keeping its heartbeat alive.

The heartbeat loop survives resource-manager restarts: a NOT_FOUND answer (the worker expired or the state was
lost) makes it register again; an unreachable resource manager is retried with backoff.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc import aio

from rollart.runtime.client import channel
from rollart.runtime.config import TLSConfig
from rollart.runtime.telemetry import log_fields
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

log = logging.getLogger(__name__)

RM_SERVICE = "rollart.v1.ResourceManager"
# Every resource-manager method is safe to repeat (registration and binding are idempotent by id).
RM_IDEMPOTENT = (RM_SERVICE,)


def resource_manager_channel(address: str, token: str | None, tls: TLSConfig | None = None) -> aio.Channel:
    return channel(address, token=token, tls=tls, idempotent=RM_IDEMPOTENT, default_timeout=10.0)


class Registration:
    """Keeps ``worker`` registered while running; deregisters on ``stop()`` (graceful leave)."""

    def __init__(
        self,
        address: str,
        worker: rm.Worker,
        *,
        token: str | None,
        tls: TLSConfig | None = None,
        pool: rm.Pool | None = None,
    ) -> None:
        self.worker = worker
        self.pool = pool  # registered first when given (local clusters create their own pools)
        self._channel = resource_manager_channel(address, token, tls)
        self.stub = rm_grpc.ResourceManagerStub(self._channel)
        self._task: asyncio.Task | None = None
        self.interval = max(worker.ttl_seconds / 3, 0.05) if worker.ttl_seconds else 1.0
        self.registered = asyncio.Event()

    async def _register(self) -> None:
        if self.pool is not None:
            await self.stub.RegisterPool(rm.RegisterPoolRequest(pool=self.pool))
        resp = await self.stub.RegisterWorker(rm.RegisterWorkerRequest(worker=self.worker))
        self.interval = resp.heartbeat_interval_seconds or self.interval
        self.registered.set()
        log.info("registered with resource manager", extra=log_fields(worker_id=self.worker.worker_id))

    async def start(self) -> None:
        await self._register()
        self._task = asyncio.create_task(self._loop(), name="rm-heartbeat")

    async def _loop(self) -> None:
        backoff = self.interval
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.stub.Heartbeat(rm.HeartbeatRequest(worker_id=self.worker.worker_id))
                backoff = self.interval
            except aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    try:
                        await self._register()
                    except aio.AioRpcError as again:
                        log.warning("re-register failed: %s", again.details())
                else:
                    log.warning("heartbeat failed: %s %s", exc.code().name, exc.details())
                    backoff = min(backoff * 2, 5.0)
                    await asyncio.sleep(backoff)

    async def stop(self, deregister: bool = True) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if deregister:
            try:
                await self.stub.DeregisterWorker(rm.DeregisterWorkerRequest(worker_id=self.worker.worker_id), timeout=3)
            except aio.AioRpcError as exc:
                log.warning("deregister failed: %s", exc.details())
        await self._channel.close()
