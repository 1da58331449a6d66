"""Client channels: idempotent calls retry with backoff while a server comes up; deadlines bound every call."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import grpc
import pytest

from rollart.discovery import RM_IDEMPOTENT
from rollart.local.processes import free_port
from rollart.runtime.client import channel
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc
from rollart.v1 import worker_pb2, worker_pb2_grpc


def test_idempotent_call_rides_out_a_late_server_and_others_fail_fast(services, redis_url, job_token):
    port = free_port()
    address = f"127.0.0.1:{port}"

    def start_later():
        time.sleep(0.6)
        services.resource_manager(redis_url, ROLLART_LISTEN=address)

    async def calls():
        retrying = channel(address, token=job_token, idempotent=RM_IDEMPOTENT, default_timeout=20)
        plain = channel(address, token=job_token, default_timeout=20)
        try:
            t0 = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await rm_grpc.ResourceManagerStub(plain).ListPools(rm.ListPoolsRequest())
            assert exc.value.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - t0 < 0.5
            starter = threading.Thread(target=start_later)
            starter.start()
            resp = await rm_grpc.ResourceManagerStub(retrying).ListPools(rm.ListPoolsRequest())
            starter.join()
            return resp
        finally:
            await retrying.close()
            await plain.close()

    assert list(asyncio.run(calls()).pools) == []


def test_default_deadline_bounds_a_slow_call(services, job_token):
    _, info = services.start(
        "worker",
        [sys.executable, "-m", "rollart.sdk.host", "--worker", "tests.integration.sdk.workers:EchoWorker", "--pool", "p"],
    )

    async def call():
        ch = channel(info["address"], token=job_token, default_timeout=0.3)
        try:
            req = worker_pb2.InvokeRequest(method="slow", args_json="[5]")
            await worker_pb2_grpc.ClusterWorkerStub(ch).Invoke(req)
        finally:
            await ch.close()

    t0 = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        asyncio.run(call())
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 2
