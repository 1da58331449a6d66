"""Request checks of the resource manager beyond the ids (built on ``rollart.runtime.validation``).

Invariant: nothing the resource manager stores holds a NaN, an infinity, a negative size or an unbounded string
or list: hardware, regions, labels, TTLs and load reports are bounded here before a record is written.
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
    """The parts of a pool the servicer does not check itself (name, kind, fallbacks)."""
    v.integer("pool.capacity", p.capacity, 1, MAX_CAPACITY)
    hardware("pool.hardware", p.hardware)
    region("pool.region", p.region)
    labels("pool.labels", p.labels)
    v.items("pool.fallback_pools", p.fallback_pools, 16)


def worker(w: rm.Worker) -> None:
    """The parts of a worker the servicer does not check itself (id, role, pool)."""
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
    """The parts of a bind request the servicer does not check itself."""
    v.integer("slots_per_replica", req.slots_per_replica, 0, MAX_CAPACITY)
    ids.check_name("preferred_pool", req.preferred_pool, required=False)
    v.enum("preferred_kind", req.preferred_kind, common_pb2.PoolKind, required=False)
    tags("hardware_tags", req.hardware_tags)
    v.text("affinity_tag", req.affinity_tag, MAX_TAG_CHARS)
