"""Placement rules of the resource manager, without Redis or gRPC."""

from __future__ import annotations

import pytest

from rollart.v1 import common_pb2
from rollart.v1 import resource_manager_pb2 as rm
from rollart_resource_manager.placement import PlacementError, place, pool_order

K = common_pb2.PoolKind


def pools(**spec):
    return {n: rm.Pool(name=n, kind=k, capacity=c, up=True) for n, (k, c) in spec.items()}


def workers(*items):
    return {
        wid: rm.Worker(worker_id=wid, role=role, pool=p, hardware=common_pb2.Hardware(tags=list(tags)))
        for wid, role, p, tags in items
    }


def test_order_prefers_kind_then_default_compatible():
    ps = pools(a=(K.POOL_KIND_GPU_BANDWIDTH, 1), b=(K.POOL_KIND_GPU_COMPUTE, 1), c=(K.POOL_KIND_CPU, 1))
    order, preferred = pool_order(rm.BindRequest(preferred_kind=K.POOL_KIND_GPU_BANDWIDTH, allow_fallback=True), ps)
    assert order == ["a", "b"] and preferred == {"a"}
    order, _ = pool_order(rm.BindRequest(preferred_kind=K.POOL_KIND_GPU_BANDWIDTH), ps)
    assert order == ["a"]


def test_explicit_fallbacks_win_over_kind_defaults():
    ps = pools(a=(K.POOL_KIND_GPU_BANDWIDTH, 1), b=(K.POOL_KIND_GPU_COMPUTE, 1), c=(K.POOL_KIND_CPU, 1))
    ps["a"].fallback_pools.append("c")
    order, _ = pool_order(rm.BindRequest(preferred_pool="a", allow_fallback=True), ps)
    assert order == ["a", "c"]


def test_tagged_workers_first_and_capacity_respected():
    ps = pools(a=(K.POOL_KIND_CPU, 2))
    ws = workers(("w1", "r", "a", []), ("w2", "r", "a", ["fast"]), ("w3", "r", "a", ["fast"]))
    pl = place(rm.BindRequest(role="r", replicas=3, preferred_pool="a", hardware_tags=["fast"]), ps, ws, set(), {})
    assert [w.worker_id for w in pl.workers] == ["w2", "w3"] and pl.degraded and not pl.fallback


def test_keeps_live_members_on_replacement():
    ps = pools(a=(K.POOL_KIND_CPU, 8))
    ws = workers(("w1", "r", "a", []), ("w2", "r", "a", []), ("w3", "r", "a", []))
    req = rm.BindRequest(role="r", replicas=2, preferred_pool="a")
    cur = rm.Binding(workers=[rm.BoundWorker(worker_id="w3", pool="a"), rm.BoundWorker(worker_id="gone", pool="a")])
    pl = place(req, ps, ws, set(), {}, current=cur)
    assert [w.worker_id for w in pl.workers] == ["w3", "w1"]


def test_busy_workers_and_down_pools_are_skipped():
    ps = pools(a=(K.POOL_KIND_GPU_COMPUTE, 8), b=(K.POOL_KIND_GPU_BANDWIDTH, 8))
    ps["a"].up = False
    ws = workers(("w1", "r", "a", []), ("w2", "r", "b", []), ("w3", "r", "b", []))
    pl = place(rm.BindRequest(role="r", replicas=1, preferred_pool="a", allow_fallback=True), ps, ws, {"w2"}, {})
    assert [w.worker_id for w in pl.workers] == ["w3"] and pl.fallback
    with pytest.raises(PlacementError, match="down"):
        place(rm.BindRequest(role="r", replicas=1, preferred_pool="a"), ps, ws, set(), {})
