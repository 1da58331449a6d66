"""Where a worker group goes: the preferred pool first, then compatible pools, never waiting.

Pure functions over protobuf snapshots so that the rules can be tested without Redis or gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollart.v1 import common_pb2
from rollart.v1 import resource_manager_pb2 as rm

K = common_pb2.PoolKind
# When a pool names no fallbacks, pools of these kinds are tried (GPU kinds serve each other's work more slowly
# rather than not at all; CPU work can go to serverless capacity and back).
DEFAULT_COMPATIBLE: dict[int, tuple[int, ...]] = {
    K.POOL_KIND_GPU_COMPUTE: (K.POOL_KIND_GPU_BANDWIDTH,),
    K.POOL_KIND_GPU_BANDWIDTH: (K.POOL_KIND_GPU_COMPUTE,),
    K.POOL_KIND_CPU: (K.POOL_KIND_SERVERLESS,),
    K.POOL_KIND_SERVERLESS: (K.POOL_KIND_CPU,),
}


class PlacementError(Exception):
    """No compatible pool has a live, free worker of the role."""


@dataclass
class Placement:
    workers: list[rm.BoundWorker]
    fallback: bool
    degraded: bool
    reason: str
    notes: list[str] = field(default_factory=list)


def pool_order(req: rm.BindRequest, pools: dict[str, rm.Pool]) -> tuple[list[str], set[str]]:
    """Pools to try in order, and which of them are preferred."""
    if req.preferred_pool:
        preferred = [req.preferred_pool] if req.preferred_pool in pools else []
    elif req.preferred_kind != K.POOL_KIND_UNSPECIFIED:
        preferred = sorted(n for n, p in pools.items() if p.kind == req.preferred_kind)
    else:
        preferred = sorted(pools)
    order = list(preferred)
    if req.allow_fallback:
        for name in preferred:
            explicit = [f for f in pools[name].fallback_pools if f in pools]
            if explicit:
                candidates = explicit
            else:
                kinds = DEFAULT_COMPATIBLE.get(pools[name].kind, ())
                candidates = sorted(n for n, p in pools.items() if p.kind in kinds)
            order.extend(c for c in candidates if c not in order)
        if not preferred and req.preferred_kind != K.POOL_KIND_UNSPECIFIED:
            kinds = DEFAULT_COMPATIBLE.get(req.preferred_kind, ())
            order.extend(sorted(n for n, p in pools.items() if p.kind in kinds and n not in order))
    return order, set(preferred)


def place(
    req: rm.BindRequest,
    pools: dict[str, rm.Pool],
    alive: dict[str, rm.Worker],
    busy: set[str],
    bound_slots: dict[str, int],
    current: rm.Binding | None = None,
) -> Placement:
    """Choose up to ``req.replicas`` workers.

    ``alive``: live workers by id; ``busy``: workers bound to other bindings; ``bound_slots``: slots used per pool by
    other bindings; ``current``: this binding's previous placement, whose live members are kept (stability: a
    re-placement only replaces what was lost).
    """
    slots = max(req.slots_per_replica, 1)
    order, preferred_pools = pool_order(req, pools)
    used = dict(bound_slots)
    tags = set(req.hardware_tags)
    chosen: list[rm.BoundWorker] = []
    notes: list[str] = []

    def bound(worker: rm.Worker) -> rm.BoundWorker:
        preferred = worker.pool in preferred_pools and tags.issubset(worker.hardware.tags)
        return rm.BoundWorker(
            worker_id=worker.worker_id,
            endpoint=worker.endpoint,
            pool=worker.pool,
            hardware=worker.hardware,
            preferred=preferred,
        )

    if current is not None:
        for member in current.workers:
            w = alive.get(member.worker_id)
            if w is None or w.pool not in order or not pools[w.pool].up or len(chosen) >= req.replicas:
                continue
            chosen.append(bound(w))
            used[w.pool] = used.get(w.pool, 0) + slots

    taken = {b.worker_id for b in chosen}
    for name in order:
        if len(chosen) >= req.replicas:
            break
        pool = pools[name]
        if not pool.up:
            notes.append(f"pool {name} is down")
            continue
        free = [
            w
            for w in alive.values()
            if w.pool == name and w.role == req.role and w.worker_id not in busy and w.worker_id not in taken
        ]
        if not free:
            notes.append(f"pool {name} has no free live {req.role} worker")
            continue
        # Workers carrying every requested tag first; then a stable order.
        free.sort(key=lambda w: (not tags.issubset(w.hardware.tags), w.worker_id))
        for w in free:
            if len(chosen) >= req.replicas:
                break
            if used.get(name, 0) + slots > pool.capacity:
                notes.append(f"pool {name} is full ({used.get(name, 0)}/{pool.capacity} slots)")
                break
            chosen.append(bound(w))
            taken.add(w.worker_id)
            used[name] = used.get(name, 0) + slots

    if not chosen:
        tried = ", ".join(order) if order else "none"
        raise PlacementError(
            f"no live {req.role!r} worker can be bound (pools tried: {tried}"
            + (f"; {'; '.join(notes)}" if notes else "")
            + ")"
        )
    fallback = any(not b.preferred for b in chosen)
    degraded = len(chosen) < req.replicas
    parts = [f"{len(chosen)}/{req.replicas} bound"]
    if fallback:
        parts.append("fallback: " + ", ".join(sorted({b.pool for b in chosen if not b.preferred})))
    if notes:
        parts.append("; ".join(dict.fromkeys(notes)))
    return Placement(chosen, fallback, degraded, "; ".join(parts), notes)
