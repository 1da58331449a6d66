"""The resource manager over a real redis-server that is SIGKILLed: its RPCs (and an open or new Watch) end
UNAVAILABLE (retryable), never UNKNOWN; redis back on its port and folder, the state is there again (AOF)."""

from __future__ import annotations

import time

import grpc
import pytest

from rollart.local.processes import start_redis
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

pytestmark = pytest.mark.timeout(120)


def _code(fn) -> grpc.StatusCode:
    try:
        out = fn()
        if not hasattr(out, "ByteSize"):
            for _ in out:
                pass
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_redis_down_is_unavailable_and_redis_back_recovers(services, tmp_path, channel_factory, auth_md):
    redis, url = start_redis(tmp_path / "store")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        _, address = services.resource_manager(url)
        s, md = rm_grpc.ResourceManagerStub(channel_factory(address)), auth_md
        s.RegisterPool(rm.RegisterPoolRequest(pool=rm.Pool(name="p", kind=3, capacity=4)), metadata=md, timeout=10)
        w = rm.Worker(worker_id="w1", role="actor", endpoint="127.0.0.1:1", pool="p", ttl_seconds=60)
        s.RegisterWorker(rm.RegisterWorkerRequest(worker=w), metadata=md, timeout=10)
        watch = s.Watch(rm.WatchRequest(), metadata=md, timeout=30)
        time.sleep(0.5)
        redis.kill()
        assert _code(lambda: watch) == grpc.StatusCode.UNAVAILABLE
        calls = {
            "Watch": lambda: s.Watch(rm.WatchRequest(), metadata=md, timeout=10),
            "ListPools": lambda: s.ListPools(rm.ListPoolsRequest(), metadata=md, timeout=10),
            "ListWorkers": lambda: s.ListWorkers(rm.ListWorkersRequest(), metadata=md, timeout=10),
            "ListBindings": lambda: s.ListBindings(rm.ListBindingsRequest(), metadata=md, timeout=10),
            "RegisterWorker": lambda: s.RegisterWorker(rm.RegisterWorkerRequest(worker=w), metadata=md, timeout=10),
            "Heartbeat": lambda: s.Heartbeat(rm.HeartbeatRequest(worker_id="w1"), metadata=md, timeout=10),
        }
        codes = {name: _code(fn) for name, fn in calls.items()}
        assert codes == dict.fromkeys(calls, grpc.StatusCode.UNAVAILABLE)

        redis, _ = start_redis(tmp_path / "store", port=port)
        deadline = time.monotonic() + 20
        while _code(calls["ListPools"]) != grpc.StatusCode.OK:
            assert time.monotonic() < deadline, "the resource manager did not recover"
            time.sleep(0.2)
        assert [p.name for p in s.ListPools(rm.ListPoolsRequest(), metadata=md, timeout=10).pools] == ["p"]
        assert [x.worker_id for x in s.ListWorkers(rm.ListWorkersRequest(), metadata=md, timeout=10).workers] == ["w1"]
    finally:
        redis.stop()
