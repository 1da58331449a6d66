"""Every request check of the resource manager (built on ``rollart.runtime.validation``).

Invariant: nothing the resource manager stores holds a NaN, an infinity, a negative size or an unbounded string
or list: ids, names, hardware, regions, labels, TTLs and load reports are checked here before a record is
written; what needs the stored state (a pool that does not exist) stays in the servicer. See
docs/architecture.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from rollart.runtime import errors, ids
from rollart.runtime import validation as v
from rollart.v1 import common_pb2
from rollart.v1 import resource_manager_pb2 as rm

MAX_ACCELERATORS = 1 << 16
MAX_MEMORY_GIB = 1 << 20  # 1 PiB per worker: far above any machine, far below float trouble
MAX_TAGS = 64
MAX_TAG_CHARS = 128
MAX_LABELS = 64
MAX_LABEL_KEY_CHARS = 128
MAX_LABEL_VALUE_CHARS = 1024
MAX_CAPACITY = 1_000_000
MAX_TTL_SECONDS = 3600.0
MAX_ENDPOINT_CHARS = 512
# A hardware tag: printable, no spaces (affinity rules and hw_mapping compare tags as exact strings).
TAG = re.compile(r"[A-Za-z0-9._:/=+@#~-]+")
# A worker's declared hardware kind ("kind:<name>" tag): must be a known kind and its pool's.
KIND_TAGS = {
    "kind:gpu-compute": common_pb2.POOL_KIND_GPU_COMPUTE,
    "kind:gpu-bandwidth": common_pb2.POOL_KIND_GPU_BANDWIDTH,
    "kind:cpu": common_pb2.POOL_KIND_CPU,
    "kind:serverless": common_pb2.POOL_KIND_SERVERLESS,
}


def hardware(field: str, hw: common_pb2.Hardware) -> None:
    v.text(f"{field}.accelerator", hw.accelerator, 64)
    v.integer(f"{field}.count", hw.count, 0, MAX_ACCELERATORS)
    v.number(f"{field}.memory_gib", hw.memory_gib, 0, MAX_MEMORY_GIB)
    tags(f"{field}.tags", hw.tags)


def tags(field: str, values: Sequence[str]) -> None:
    v.items(field, values, MAX_TAGS)
    for i, tag in enumerate(values):
        v.text(f"{field}[{i}]", tag, MAX_TAG_CHARS, required=True)
        if not TAG.fullmatch(tag):
            raise errors.InvalidArgument(f"{field}[{i}]", "a tag is made of A-Za-z0-9._:/=+@#~- (no spaces)")
        if tag.startswith("kind:") and tag not in KIND_TAGS:
            raise errors.InvalidArgument(f"{field}[{i}]", f"unknown kind (one of {', '.join(KIND_TAGS)})")


def worker_kind(w: rm.Worker, pool: rm.Pool) -> None:
    """A worker that declares its kind (a ``kind:`` tag) must be in a pool of that kind: a compute-kind actor
    registered into a bandwidth pool would be routed the wrong tasks."""
    for i, tag in enumerate(w.hardware.tags):
        kind = KIND_TAGS.get(tag)
        if kind is not None and kind != pool.kind:
            have = common_pb2.PoolKind.Name(pool.kind).removeprefix("POOL_KIND_").lower().replace("_", "-")
            raise errors.InvalidArgument(
                f"worker.hardware.tags[{i}]", f"says {tag} but pool {w.pool!r} is of kind {have}"
            )


def region(field: str, value: str) -> None:
    """A region is optional; when set it follows the id rule, at most 128 characters."""
    ids.check_id(field, value, required=False, max_chars=128)


def labels(field: str, values: Mapping[str, str]) -> None:
    v.mapping(field, values, MAX_LABELS, max_key_chars=MAX_LABEL_KEY_CHARS, max_value_chars=MAX_LABEL_VALUE_CHARS)


def pool(p: rm.Pool) -> None:
    """A pool to register."""
    ids.check_name("pool.name", p.name)
    if p.kind == common_pb2.POOL_KIND_UNSPECIFIED or p.kind not in common_pb2.PoolKind.values():
        raise errors.InvalidArgument("pool.kind", "is required (GPU_COMPUTE, GPU_BANDWIDTH, CPU or SERVERLESS)")
    if p.capacity <= 0:
        raise errors.InvalidArgument("pool.capacity", f"must be > 0, got {p.capacity}")
    for f in p.fallback_pools:
        if not ids.is_name(f) or f == p.name:
            raise errors.InvalidArgument("pool.fallback_pools", f"has an invalid entry {errors.shorten(f)}")
    v.integer("pool.capacity", p.capacity, 1, MAX_CAPACITY)
    hardware("pool.hardware", p.hardware)
    region("pool.region", p.region)
    labels("pool.labels", p.labels)
    v.items("pool.fallback_pools", p.fallback_pools, 16)


def worker(w: rm.Worker) -> None:
    """A worker to register (whether its pool exists is the servicer's to say)."""
    ids.check_id("worker.worker_id", w.worker_id)
    ids.check_name("worker.role", w.role)
    if not w.endpoint or len(w.endpoint) > MAX_ENDPOINT_CHARS:
        raise errors.InvalidArgument("worker.endpoint", "is required (host:port or URL, at most 512 characters)")
    if w.ttl_seconds < 0 or w.ttl_seconds > MAX_TTL_SECONDS:
        raise errors.InvalidArgument("worker.ttl_seconds", f"must be within [0, 3600], got {w.ttl_seconds}")
    v.text("worker.endpoint", w.endpoint, MAX_ENDPOINT_CHARS, required=True)
    v.number("worker.ttl_seconds", w.ttl_seconds, 0, MAX_TTL_SECONDS)
    hardware("worker.hardware", w.hardware)
    region("worker.region", w.region)
    labels("worker.labels", w.labels)


def load(values: Mapping[str, float]) -> None:
    """A heartbeat's load report: finite numbers under short keys (kept as ``load.<key>`` labels)."""
    v.items("load", values, 32)
    for key, value in values.items():
        v.text("load", key, 64)
        v.number(f"load[{key}]", value)


def bind(req: rm.BindRequest) -> None:
    """A bind request."""
    ids.check_name("binding_id", req.binding_id)
    ids.check_name("role", req.role)
    if req.replicas <= 0 or req.replicas > 10_000:
        raise errors.InvalidArgument("replicas", f"must be within [1, 10000], got {req.replicas}")
    if req.slots_per_replica < 0:
        raise errors.InvalidArgument("slots_per_replica", f"must be >= 0, got {req.slots_per_replica}")
    if req.preferred_kind not in common_pb2.PoolKind.values():
        raise errors.InvalidArgument("preferred_kind", f"{req.preferred_kind} is not a PoolKind")
    v.integer("slots_per_replica", req.slots_per_replica, 0, MAX_CAPACITY)
    ids.check_name("preferred_pool", req.preferred_pool, required=False)
    v.enum("preferred_kind", req.preferred_kind, common_pb2.PoolKind, required=False)
    tags("hardware_tags", req.hardware_tags)
    v.text("affinity_tag", req.affinity_tag, MAX_TAG_CHARS)
