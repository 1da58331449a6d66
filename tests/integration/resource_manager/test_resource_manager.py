"""The resource manager as a real process over a real redis-server."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from rollart.v1 import common_pb2
from rollart.v1 import resource_manager_pb2 as rm
from rollart.v1 import resource_manager_pb2_grpc as rm_grpc

K = common_pb2.PoolKind


@pytest.fixture
def rm_env(services, redis_url, channel_factory, auth_md):
    proc, address = services.resource_manager(redis_url)
    stub = rm_grpc.ResourceManagerStub(channel_factory(address))
    return proc, address, stub, auth_md


def pool(stub, md, name, kind, capacity=8, **kw):
    return stub.RegisterPool(
        rm.RegisterPoolRequest(pool=rm.Pool(name=name, kind=kind, capacity=capacity, **kw)), metadata=md
    )


def worker(stub, md, wid, pool_name, role="actor", tags=(), ttl=30.0):
    return stub.RegisterWorker(
        rm.RegisterWorkerRequest(
            worker=rm.Worker(
                worker_id=wid,
                role=role,
                endpoint=f"127.0.0.1:{10000 + abs(hash(wid)) % 5000}",
                pool=pool_name,
                hardware=common_pb2.Hardware(accelerator="cpu", tags=list(tags)),
                ttl_seconds=ttl,
            )
        ),
        metadata=md,
    )


def two_gpu_pools(stub, md, compute_cap=8, bandwidth_cap=8):
    pool(stub, md, "h800", K.POOL_KIND_GPU_COMPUTE, compute_cap)
    pool(stub, md, "h20", K.POOL_KIND_GPU_BANDWIDTH, bandwidth_cap)
    for i in range(2):
        worker(stub, md, f"c{i}", "h800", tags=["prefill"])
        worker(stub, md, f"b{i}", "h20", tags=["decode"])


def test_affinity_binding_prefers_the_matching_pool(rm_env):
    _, _, stub, md = rm_env
    two_gpu_pools(stub, md)
    b = stub.Bind(
        rm.BindRequest(
            binding_id="decode-actors",
            role="actor",
            replicas=2,
            preferred_kind=K.POOL_KIND_GPU_BANDWIDTH,
            hardware_tags=["decode"],
            allow_fallback=True,
        ),
        metadata=md,
    )
    assert sorted(w.worker_id for w in b.workers) == ["b0", "b1"]
    assert all(w.preferred for w in b.workers) and not b.fallback and not b.degraded
    # The binding is recorded and the pool accounting follows it.
    assert stub.GetBinding(rm.GetBindingRequest(binding_id="decode-actors"), metadata=md) == b
    pools = {p.name: p for p in stub.ListPools(rm.ListPoolsRequest(), metadata=md).pools}
    assert pools["h20"].bound_slots == 2 and pools["h800"].bound_slots == 0
    workers = {w.worker_id: w for w in stub.ListWorkers(rm.ListWorkersRequest(), metadata=md).workers}
    assert list(workers["b0"].binding_ids) == ["decode-actors"]


def test_fallback_when_preferred_pool_is_full(rm_env):
    _, _, stub, md = rm_env
    two_gpu_pools(stub, md, bandwidth_cap=1)
    b = stub.Bind(
        rm.BindRequest(
            binding_id="decode", role="actor", replicas=2, preferred_kind=K.POOL_KIND_GPU_BANDWIDTH, allow_fallback=True
        ),
        metadata=md,
    )
    pools_used = sorted(w.pool for w in b.workers)
    assert pools_used == ["h20", "h800"] and b.fallback and not b.degraded
    assert "full" in b.reason
    # Without fallback the binding is partial rather than waiting.
    b2 = stub.Bind(
        rm.BindRequest(binding_id="decode-strict", role="actor", replicas=2, preferred_pool="h800"), metadata=md
    )
    assert len(b2.workers) == 1 and b2.degraded


def test_fallback_when_preferred_workers_expired_and_rebinding(rm_env):
    _, _, stub, md = rm_env
    pool(stub, md, "h800", K.POOL_KIND_GPU_COMPUTE)
    pool(stub, md, "h20", K.POOL_KIND_GPU_BANDWIDTH)
    worker(stub, md, "c0", "h800")
    worker(stub, md, "b0", "h20", ttl=0.4)  # never heartbeats
    b = stub.Bind(
        rm.BindRequest(
            binding_id="d", role="actor", replicas=1, preferred_kind=K.POOL_KIND_GPU_BANDWIDTH, allow_fallback=True
        ),
        metadata=md,
    )
    assert [w.worker_id for w in b.workers] == ["b0"]
    time.sleep(1.0)
    # The reaper re-placed the binding onto the compatible pool.
    b = stub.GetBinding(rm.GetBindingRequest(binding_id="d"), metadata=md)
    assert [w.worker_id for w in b.workers] == ["c0"] and b.fallback
    # A new worker in the compatible pool: a fresh bind falls back at once (never waits for the preferred pool).
    worker(stub, md, "c1", "h800")
    t0 = time.monotonic()
    b2 = stub.Bind(
        rm.BindRequest(
            binding_id="d2", role="actor", replicas=1, preferred_kind=K.POOL_KIND_GPU_BANDWIDTH, allow_fallback=True
        ),
        metadata=md,
    )
    assert time.monotonic() - t0 < 1.0
    assert [w.worker_id for w in b2.workers] == ["c1"] and b2.fallback


def test_no_worker_anywhere_is_unavailable_at_once(rm_env):
    _, _, stub, md = rm_env
    pool(stub, md, "cpu", K.POOL_KIND_CPU)
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as exc:
        stub.Bind(rm.BindRequest(binding_id="x", role="reward", replicas=1, allow_fallback=True), metadata=md)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE and "reward" in exc.value.details()
    assert time.monotonic() - t0 < 1.0


def test_pool_marked_down_moves_bindings(rm_env):
    _, _, stub, md = rm_env
    two_gpu_pools(stub, md)
    stub.Bind(
        rm.BindRequest(binding_id="a", role="actor", replicas=2, preferred_pool="h20", allow_fallback=True), metadata=md
    )
    stub.SetPoolState(rm.SetPoolStateRequest(name="h20", up=False), metadata=md)
    b = stub.GetBinding(rm.GetBindingRequest(binding_id="a"), metadata=md)
    assert sorted(w.pool for w in b.workers) == ["h800", "h800"] and b.fallback


def test_heartbeat_keeps_alive_then_expiry(rm_env):
    _, _, stub, md = rm_env
    pool(stub, md, "cpu", K.POOL_KIND_CPU)
    resp = worker(stub, md, "w1", "cpu", role="envmanager", ttl=0.5)
    assert 0 < resp.heartbeat_interval_seconds <= 0.5
    for _ in range(8):  # 1.2 s of heartbeats: well past the TTL
        stub.Heartbeat(rm.HeartbeatRequest(worker_id="w1", load={"tokens_per_s": 123.0}), metadata=md)
        time.sleep(0.15)
    alive = stub.ListWorkers(rm.ListWorkersRequest(role="envmanager"), metadata=md).workers
    assert [w.worker_id for w in alive] == ["w1"] and alive[0].labels["load.tokens_per_s"] == "123"
    time.sleep(0.9)
    assert stub.ListWorkers(rm.ListWorkersRequest(role="envmanager"), metadata=md).workers == []
    expired = stub.ListWorkers(rm.ListWorkersRequest(role="envmanager", include_expired=True), metadata=md).workers
    assert expired[0].state == rm.WORKER_STATE_EXPIRED
    with pytest.raises(grpc.RpcError) as exc:
        stub.Heartbeat(rm.HeartbeatRequest(worker_id="w1"), metadata=md)
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    # Registering again brings it back.
    worker(stub, md, "w1", "cpu", role="envmanager", ttl=5)
    assert len(stub.ListWorkers(rm.ListWorkersRequest(role="envmanager"), metadata=md).workers) == 1


def test_restart_after_sigkill_serves_the_same_state(services, redis_url, channel_factory, auth_md):
    md = auth_md
    proc, address = services.resource_manager(redis_url)
    stub = rm_grpc.ResourceManagerStub(channel_factory(address))
    two_gpu_pools(stub, md)
    b = stub.Bind(
        rm.BindRequest(
            binding_id="rollout", role="actor", replicas=3, preferred_kind=K.POOL_KIND_GPU_COMPUTE, allow_fallback=True
        ),
        metadata=md,
    )
    before = (
        stub.ListPools(rm.ListPoolsRequest(), metadata=md),
        stub.ListWorkers(rm.ListWorkersRequest(), metadata=md),
        stub.ListBindings(rm.ListBindingsRequest(), metadata=md),
    )
    proc.kill()
    proc2, address2 = services.resource_manager(redis_url)
    stub2 = rm_grpc.ResourceManagerStub(channel_factory(address2))
    after = (
        stub2.ListPools(rm.ListPoolsRequest(), metadata=md),
        stub2.ListWorkers(rm.ListWorkersRequest(), metadata=md),
        stub2.ListBindings(rm.ListBindingsRequest(), metadata=md),
    )
    assert after == before
    assert stub2.GetBinding(rm.GetBindingRequest(binding_id="rollout"), metadata=md) == b
    # Binding the same request again is idempotent.
    again = stub2.Bind(b.request, metadata=md)
    assert [w.worker_id for w in again.workers] == [w.worker_id for w in b.workers]


@pytest.mark.parametrize(
    "call, request_, code",
    [
        (
            "RegisterPool",
            rm.RegisterPoolRequest(pool=rm.Pool(name="Bad Name!", kind=K.POOL_KIND_CPU, capacity=1)),
            "INVALID_ARGUMENT",
        ),
        (
            "RegisterPool",
            rm.RegisterPoolRequest(pool=rm.Pool(name="p", kind=K.POOL_KIND_CPU, capacity=0)),
            "INVALID_ARGUMENT",
        ),
        ("RegisterPool", rm.RegisterPoolRequest(pool=rm.Pool(name="p", capacity=1)), "INVALID_ARGUMENT"),
        ("RegisterPool", rm.RegisterPoolRequest(pool=rm.Pool(name="p", kind=99, capacity=1)), "INVALID_ARGUMENT"),
        (
            "RegisterWorker",
            rm.RegisterWorkerRequest(worker=rm.Worker(worker_id="", role="a", endpoint="x:1", pool="cpu")),
            "INVALID_ARGUMENT",
        ),
        (
            "RegisterWorker",
            rm.RegisterWorkerRequest(worker=rm.Worker(worker_id="w", role="a", endpoint="", pool="cpu")),
            "INVALID_ARGUMENT",
        ),
        (
            "RegisterWorker",
            rm.RegisterWorkerRequest(
                worker=rm.Worker(worker_id="w", role="a", endpoint="x:1", pool="cpu", ttl_seconds=-1)
            ),
            "INVALID_ARGUMENT",
        ),
        (
            "RegisterWorker",
            rm.RegisterWorkerRequest(worker=rm.Worker(worker_id="w", role="a", endpoint="x:1", pool="nope")),
            "FAILED_PRECONDITION",
        ),
        ("Bind", rm.BindRequest(binding_id="b", role="actor", replicas=0), "INVALID_ARGUMENT"),
        ("Bind", rm.BindRequest(binding_id="", role="actor", replicas=1), "INVALID_ARGUMENT"),
        (
            "Bind",
            rm.BindRequest(binding_id="b", role="actor", replicas=1, preferred_pool="nope"),
            "FAILED_PRECONDITION",
        ),
        ("Heartbeat", rm.HeartbeatRequest(worker_id=""), "INVALID_ARGUMENT"),
        ("GetBinding", rm.GetBindingRequest(binding_id="missing"), "NOT_FOUND"),
        ("SetPoolState", rm.SetPoolStateRequest(name="missing"), "NOT_FOUND"),
        # Hardware, regions, labels, TTLs and loads are bounded: no NaN, negative or megabyte values stored.
        *[
            ("RegisterPool", rm.RegisterPoolRequest(pool=rm.Pool(name="p", kind=K.POOL_KIND_CPU, capacity=1, **kw)),
             "INVALID_ARGUMENT")
            for kw in (
                {"hardware": common_pb2.Hardware(memory_gib=float("nan"))},
                {"hardware": common_pb2.Hardware(memory_gib=-1)},
                {"hardware": common_pb2.Hardware(memory_gib=float("inf"))},
                {"hardware": common_pb2.Hardware(count=-4)},
                {"hardware": common_pb2.Hardware(accelerator="H" * (1 << 19))},
                {"hardware": common_pb2.Hardware(tags=["t"] * 1000)},
                {"region": "r" * (1 << 19)},
                {"region": "bad region"},
                {"labels": {"k": "v" * 5000}},
            )
        ],
        *[
            ("RegisterWorker", rm.RegisterWorkerRequest(
                worker=rm.Worker(worker_id="w", role="a", endpoint="x:1", pool="cpu", **kw)), "INVALID_ARGUMENT")
            for kw in (
                {"ttl_seconds": float("nan")},
                {"hardware": common_pb2.Hardware(memory_gib=float("nan"))},
                {"region": "r" * (1 << 19)},
            )
        ],
        ("Heartbeat", rm.HeartbeatRequest(worker_id="w", load={"tps": float("nan")}), "INVALID_ARGUMENT"),
        ("SetPoolState", rm.SetPoolStateRequest(name="n" * (1 << 19)), "INVALID_ARGUMENT"),
        # Over the resource manager's 1 MiB receive limit: refused before it is read.
        ("SetPoolState", rm.SetPoolStateRequest(name="n" * (1 << 20)), "RESOURCE_EXHAUSTED"),
        ("Bind", rm.BindRequest(binding_id="b", role="actor", replicas=1, hardware_tags=["x" * 5000]),
         "INVALID_ARGUMENT"),
    ],
)
def test_malformed_requests_get_clear_errors_and_change_nothing(rm_env, call, request_, code):
    _, _, stub, md = rm_env
    pool(stub, md, "cpu", K.POOL_KIND_CPU)
    before = (
        stub.ListPools(rm.ListPoolsRequest(), metadata=md),
        stub.ListWorkers(rm.ListWorkersRequest(), metadata=md),
    )
    with pytest.raises(grpc.RpcError) as exc:
        getattr(stub, call)(request_, metadata=md)
    assert exc.value.code().name == code, exc.value.details()
    assert exc.value.details()
    assert len(exc.value.details()) < 1024  # never the caller's megabyte echoed back
    after = (stub.ListPools(rm.ListPoolsRequest(), metadata=md), stub.ListWorkers(rm.ListWorkersRequest(), metadata=md))
    assert after == before


@pytest.mark.parametrize(
    "tags, field, why",
    [
        (["kind:gpu-compute"], "worker.hardware.tags[0]", "pool 'h20' is of kind gpu-bandwidth"),
        (["decode", "kind:tpu"], "worker.hardware.tags[1]", "unknown kind"),
        (["two words"], "worker.hardware.tags[0]", "no spaces"),
        (["nul\x00"], "worker.hardware.tags[0]", "no spaces"),
    ],
)
def test_a_malformed_or_mismatched_kind_or_tag_is_refused_with_the_field(rm_env, tags, field, why):
    _, _, stub, md = rm_env
    pool(stub, md, "h20", K.POOL_KIND_GPU_BANDWIDTH)
    with pytest.raises(grpc.RpcError) as exc:
        worker(stub, md, "w1", "h20", tags=tags)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in exc.value.details() and why in exc.value.details(), exc.value.details()
    assert not stub.ListWorkers(rm.ListWorkersRequest(), metadata=md).workers
    # The declared kind of its pool is accepted and listed (the proxy routes `auto` tasks by it).
    w = worker(stub, md, "w1", "h20", tags=["decode", "kind:gpu-bandwidth"]).worker
    assert list(w.hardware.tags) == ["decode", "kind:gpu-bandwidth"]


def test_garbage_bytes_are_rejected(rm_env, channel_factory):
    _, address, _, md = rm_env
    raw = channel_factory(address).unary_unary("/rollart.v1.ResourceManager/RegisterPool")
    with pytest.raises(grpc.RpcError) as exc:
        raw(b"\xff\xff\xff\xff not a protobuf", metadata=md)
    assert exc.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)


@pytest.mark.parametrize(
    "metadata", [[], [("authorization", "Bearer wrong")], [("authorization", "test-job-token-0123456789")]]
)
def test_missing_or_wrong_token_is_unauthenticated(rm_env, metadata):
    _, _, stub, md = rm_env
    with pytest.raises(grpc.RpcError) as exc:
        stub.ListPools(rm.ListPoolsRequest(), metadata=metadata)
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as exc:
        stub.RegisterPool(
            rm.RegisterPoolRequest(pool=rm.Pool(name="p", kind=K.POOL_KIND_CPU, capacity=1)), metadata=metadata
        )
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # Streaming calls are guarded too, and nothing was written.
    with pytest.raises(grpc.RpcError) as exc:
        next(iter(stub.Watch(rm.WatchRequest(), metadata=metadata, timeout=5)))
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert stub.ListPools(rm.ListPoolsRequest(), metadata=md).pools == []


def test_watch_streams_changes_and_resumes_from_a_revision(rm_env):
    _, _, stub, md = rm_env
    events: list[rm.ResourceEvent] = []
    stream = stub.Watch(rm.WatchRequest(), metadata=md, timeout=20)

    def consume():
        try:
            for ev in stream:
                events.append(ev)
        except grpc.RpcError:
            pass

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    pool(stub, md, "cpu", K.POOL_KIND_CPU)
    worker(stub, md, "w", "cpu", role="reward")
    stub.Bind(rm.BindRequest(binding_id="r", role="reward", replicas=1), metadata=md)
    deadline = time.monotonic() + 5
    while len(events) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    stream.cancel()
    ET = rm.ResourceEventType
    assert [e.type for e in events[:3]] == [
        ET.RESOURCE_EVENT_TYPE_POOL_UPSERTED,
        ET.RESOURCE_EVENT_TYPE_WORKER_REGISTERED,
        ET.RESOURCE_EVENT_TYPE_BINDING_UPDATED,
    ]
    revs = [e.revision for e in events]
    assert revs == sorted(revs) and len(set(revs)) == len(revs)
    # Resume after the first event: the rest again, nothing before.
    resumed = stub.Watch(rm.WatchRequest(from_revision=revs[0]), metadata=md, timeout=3)
    got = []
    try:
        for ev in resumed:
            got.append(ev.revision)
            if len(got) == 2:
                break
    finally:
        resumed.cancel()
    assert got == revs[1:3]
