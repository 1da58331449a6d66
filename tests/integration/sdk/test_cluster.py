"""The Worker/Cluster SDK against real worker processes, a real serverless endpoint and the resource manager."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import urllib.error
import urllib.request

import grpc
import pytest

from rollart.discovery import resource_manager_channel
from rollart.sdk import Cluster, ClusterError
from rollart.v1 import common_pb2
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc
from tests.integration.sdk.workers import EchoWorker

K = common_pb2.PoolKind
WORKER = "tests.integration.sdk.workers:EchoWorker"


async def make_pools(address: str, token: str) -> None:
    ch = resource_manager_channel(address, token)
    stub = rm_grpc.ResourceManagerStub(ch)
    for name, kind in [
        ("gc", K.POOL_KIND_GPU_COMPUTE),
        ("gb", K.POOL_KIND_GPU_BANDWIDTH),
        ("sl", K.POOL_KIND_SERVERLESS),
    ]:
        await stub.RegisterPool(rm.RegisterPoolRequest(pool=rm.Pool(name=name, kind=kind, capacity=8)))
    await ch.close()


def start_worker(services, rm_addr, name, pool, tags=(), ttl="0.6"):
    argv = [sys.executable, "-m", "rollart.sdk.host", "--worker", WORKER, "--pool", pool, "--worker-id", name]
    for t in tags:
        argv += ["--tag", t]
    return services.start(name, argv, ROLLART_RESOURCE_MANAGER=rm_addr, TEST_WORKER_NAME=name, ROLLART_TTL_SECONDS=ttl)


async def wait_workers(address, token, n, role="echo"):
    ch = resource_manager_channel(address, token)
    stub = rm_grpc.ResourceManagerStub(ch)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        ws = (await stub.ListWorkers(rm.ListWorkersRequest(role=role))).workers
        if len(ws) >= n:
            await ch.close()
            return ws
        await asyncio.sleep(0.05)
    raise AssertionError(f"only {len(ws)} {role} workers registered")


@pytest.fixture
def cluster_env(services, redis_url, job_token):
    _, address = services.resource_manager(redis_url)
    asyncio.run(make_pools(address, job_token))
    return address


async def test_register_calls_every_worker_and_gathers(services, cluster_env, job_token):
    for i in range(3):
        start_worker(services, cluster_env, f"w{i}", "gc")
    await wait_workers(cluster_env, job_token, 3)
    cluster = await Cluster.create(
        EchoWorker, binding="echo", replicas=3, resource_manager=cluster_env, token=job_token
    )
    try:
        names = await cluster.whoami()
        assert sorted(names) == ["w0", "w1", "w2"]
        assert names == [m.worker_id for m in cluster.workers]  # gathered in binding order
        with pytest.raises(ClusterError) as exc:
            await cluster.fail()
        assert len(exc.value.failures) == 3
        assert all("worker-side failure" in v for v in exc.value.failures.values())
    finally:
        await cluster.close()


async def test_hw_mapping_routes_by_tag_and_falls_back(services, cluster_env, job_token):
    start_worker(services, cluster_env, "prefill-0", "gc", tags=["prefill"])
    decode_proc, _ = start_worker(services, cluster_env, "decode-0", "gb", tags=["decode"])
    await wait_workers(cluster_env, job_token, 2)
    cluster = await Cluster.create(EchoWorker, binding="gen", replicas=2, resource_manager=cluster_env, token=job_token)
    try:
        for _ in range(3):
            assert (await cluster.work(5, tag="decode")) == {"x": 10, "served_by": "decode-0"}
            assert (await cluster.work(1, tag="prefill"))["served_by"] == "prefill-0"
        # A pool name is a tag too.
        assert (await cluster.work(1, tag="gb"))["served_by"] == "decode-0"
        # An unknown tag goes to the compatible workers, round-robin.
        served = {(await cluster.work(1, tag="other"))["served_by"] for _ in range(4)}
        assert served == {"prefill-0", "decode-0"}
        # The decode worker dies: its heartbeats stop, the binding is re-placed, decode work falls back.
        decode_proc.kill()
        await asyncio.sleep(1.5)
        assert (await cluster.work(2, tag="decode"))["served_by"] == "prefill-0"
    finally:
        await cluster.close()


async def test_register_serverless_calls_the_registered_endpoint(services, cluster_env, job_token):
    start_worker(services, cluster_env, "w0", "gc")
    _, info = services.start(
        "judge",
        [sys.executable, "-m", "rollart.sdk.serverless", "--worker", WORKER, "--name", "judge", "--pool", "sl"],
        ROLLART_RESOURCE_MANAGER=cluster_env,
    )
    await wait_workers(cluster_env, job_token, 1)
    await wait_workers(cluster_env, job_token, 1, role="judge")
    cluster = await Cluster.create(
        EchoWorker, binding="echo", replicas=1, resource_manager=cluster_env, token=job_token
    )
    try:
        assert await cluster.judge("four") == 4
    finally:
        await cluster.close()
    # The endpoint itself refuses callers without the token, and malformed bodies.
    url = info["address"] + "/invoke"
    for headers, body, status in [
        ({}, b'{"method": "judge", "args": ["x"]}', 401),
        ({"Authorization": f"Bearer {job_token}"}, b"not json", 400),
        ({"Authorization": f"Bearer {job_token}"}, b'{"method": "nope"}', 404),
    ]:
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=5)
        assert exc.value.code == status
        assert "error" in json.loads(exc.value.read())


async def test_sigterm_drains_in_flight_calls_then_leaves(services, cluster_env, job_token):
    proc, _ = start_worker(services, cluster_env, "w0", "gc", ttl="30")
    await wait_workers(cluster_env, job_token, 1)
    cluster = await Cluster.create(
        EchoWorker, binding="echo", replicas=1, resource_manager=cluster_env, token=job_token
    )
    try:
        call = asyncio.create_task(cluster.slow(1.0))
        await asyncio.sleep(0.3)
        proc.signal(signal.SIGTERM)
        assert await call == ["done"]  # the in-flight call finished during the drain
        assert await asyncio.to_thread(proc.proc.wait, 15) == 0
        # Graceful leave: deregistered at once (not left to expire).
        ch = resource_manager_channel(cluster_env, job_token)
        ws = (await rm_grpc.ResourceManagerStub(ch).ListWorkers(rm.ListWorkersRequest(role="echo"))).workers
        await ch.close()
        assert ws == []
    finally:
        await cluster.close()


async def test_worker_rejects_unknown_methods_bad_json_and_bad_tokens(services, cluster_env, job_token):
    _, info = start_worker(services, cluster_env, "w0", "gc")
    from rollart.runtime.client import channel
    from rollart.v1 import worker_pb2, worker_pb2_grpc

    good = channel(info["address"], token=job_token)
    bad = channel(info["address"], token="nope")
    try:
        stub = worker_pb2_grpc.ClusterWorkerStub(good)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.Invoke(worker_pb2.InvokeRequest(method="__init__"))
        assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await stub.Invoke(worker_pb2.InvokeRequest(method="work", args_json="{not json"))
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await worker_pb2_grpc.ClusterWorkerStub(bad).Invoke(worker_pb2.InvokeRequest(method="whoami"))
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        desc = await stub.Describe(worker_pb2.DescribeRequest())
        assert desc.methods["work"] == "hw_mapping" and desc.methods["judge"] == "register_serverless"
    finally:
        await good.close()
        await bad.close()
