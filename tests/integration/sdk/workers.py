"""Worker classes hosted by real processes in the SDK tests."""

from __future__ import annotations

import asyncio
import os

from rollart.discovery import resource_manager_channel
from rollart.sdk import Worker, hw_mapping, register, register_serverless
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc


class EchoWorker(Worker):
    role = "echo"

    @register
    def whoami(self) -> str:
        return os.environ.get("TEST_WORKER_NAME", "?")

    @hw_mapping
    def work(self, x: int) -> dict:
        return {"x": x * 2, "served_by": os.environ.get("TEST_WORKER_NAME", "?")}

    @register_serverless("judge")
    def judge(self, text: str) -> int:
        return len(text)

    @register
    async def slow(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"

    @register
    def fail(self) -> None:
        raise ValueError("worker-side failure")

    @register
    async def chain(self) -> int:
        """Calls the resource manager from inside a call: the trace must continue across both hops."""
        ch = resource_manager_channel(os.environ["ROLLART_RESOURCE_MANAGER"], os.environ["ROLLART_JOB_TOKEN"])
        try:
            pools = await rm_grpc.ResourceManagerStub(ch).ListPools(rm.ListPoolsRequest())
            return len(pools.pools)
        finally:
            await ch.close()
