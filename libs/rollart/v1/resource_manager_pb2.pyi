import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from rollart.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_ALIVE: _ClassVar[WorkerState]
    WORKER_STATE_EXPIRED: _ClassVar[WorkerState]

class ResourceEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESOURCE_EVENT_TYPE_UNSPECIFIED: _ClassVar[ResourceEventType]
    RESOURCE_EVENT_TYPE_POOL_UPSERTED: _ClassVar[ResourceEventType]
    RESOURCE_EVENT_TYPE_POOL_REMOVED: _ClassVar[ResourceEventType]
    RESOURCE_EVENT_TYPE_WORKER_REGISTERED: _ClassVar[ResourceEventType]
    RESOURCE_EVENT_TYPE_WORKER_EXPIRED: _ClassVar[ResourceEventType]
    RESOURCE_EVENT_TYPE_WORKER_DEREGISTERED: _ClassVar[ResourceEventType]
    RESOURCE_EVENT_TYPE_BINDING_UPDATED: _ClassVar[ResourceEventType]
    RESOURCE_EVENT_TYPE_BINDING_REMOVED: _ClassVar[ResourceEventType]
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_ALIVE: WorkerState
WORKER_STATE_EXPIRED: WorkerState
RESOURCE_EVENT_TYPE_UNSPECIFIED: ResourceEventType
RESOURCE_EVENT_TYPE_POOL_UPSERTED: ResourceEventType
RESOURCE_EVENT_TYPE_POOL_REMOVED: ResourceEventType
RESOURCE_EVENT_TYPE_WORKER_REGISTERED: ResourceEventType
RESOURCE_EVENT_TYPE_WORKER_EXPIRED: ResourceEventType
RESOURCE_EVENT_TYPE_WORKER_DEREGISTERED: ResourceEventType
RESOURCE_EVENT_TYPE_BINDING_UPDATED: ResourceEventType
RESOURCE_EVENT_TYPE_BINDING_REMOVED: ResourceEventType

class Pool(_message.Message):
    __slots__ = ("name", "kind", "hardware", "capacity", "region", "labels", "fallback_pools", "up", "live_workers", "bound_slots")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_POOLS_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    LIVE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    BOUND_SLOTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: _common_pb2.PoolKind
    hardware: _common_pb2.Hardware
    capacity: int
    region: str
    labels: _containers.ScalarMap[str, str]
    fallback_pools: _containers.RepeatedScalarFieldContainer[str]
    up: bool
    live_workers: int
    bound_slots: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[_common_pb2.PoolKind, str]] = ..., hardware: _Optional[_Union[_common_pb2.Hardware, _Mapping]] = ..., capacity: _Optional[int] = ..., region: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., fallback_pools: _Optional[_Iterable[str]] = ..., up: _Optional[bool] = ..., live_workers: _Optional[int] = ..., bound_slots: _Optional[int] = ...) -> None: ...

class RegisterPoolRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: Pool
    def __init__(self, pool: _Optional[_Union[Pool, _Mapping]] = ...) -> None: ...

class SetPoolStateRequest(_message.Message):
    __slots__ = ("name", "up")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    name: str
    up: bool
    def __init__(self, name: _Optional[str] = ..., up: _Optional[bool] = ...) -> None: ...

class RemovePoolRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[Pool]
    def __init__(self, pools: _Optional[_Iterable[_Union[Pool, _Mapping]]] = ...) -> None: ...

class Worker(_message.Message):
    __slots__ = ("worker_id", "role", "endpoint", "pool", "hardware", "region", "labels", "ttl_seconds", "state", "registered_at", "last_heartbeat", "binding_ids")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    BINDING_IDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: str
    endpoint: str
    pool: str
    hardware: _common_pb2.Hardware
    region: str
    labels: _containers.ScalarMap[str, str]
    ttl_seconds: float
    state: WorkerState
    registered_at: _timestamp_pb2.Timestamp
    last_heartbeat: _timestamp_pb2.Timestamp
    binding_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[str] = ..., endpoint: _Optional[str] = ..., pool: _Optional[str] = ..., hardware: _Optional[_Union[_common_pb2.Hardware, _Mapping]] = ..., region: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., ttl_seconds: _Optional[float] = ..., state: _Optional[_Union[WorkerState, str]] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_heartbeat: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., binding_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker",)
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker: Worker
    def __init__(self, worker: _Optional[_Union[Worker, _Mapping]] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("worker", "heartbeat_interval_seconds")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    worker: Worker
    heartbeat_interval_seconds: float
    def __init__(self, worker: _Optional[_Union[Worker, _Mapping]] = ..., heartbeat_interval_seconds: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "load")
    class LoadEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    load: _containers.ScalarMap[str, float]
    def __init__(self, worker_id: _Optional[str] = ..., load: _Optional[_Mapping[str, float]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("expires_at",)
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    expires_at: _timestamp_pb2.Timestamp
    def __init__(self, expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DeregisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ("role", "pool", "include_expired")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    role: str
    pool: str
    include_expired: bool
    def __init__(self, role: _Optional[str] = ..., pool: _Optional[str] = ..., include_expired: _Optional[bool] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[Worker]
    def __init__(self, workers: _Optional[_Iterable[_Union[Worker, _Mapping]]] = ...) -> None: ...

class BindRequest(_message.Message):
    __slots__ = ("binding_id", "role", "replicas", "preferred_pool", "preferred_kind", "hardware_tags", "allow_fallback", "slots_per_replica", "affinity_tag")
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_POOL_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_KIND_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_TAGS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    SLOTS_PER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_TAG_FIELD_NUMBER: _ClassVar[int]
    binding_id: str
    role: str
    replicas: int
    preferred_pool: str
    preferred_kind: _common_pb2.PoolKind
    hardware_tags: _containers.RepeatedScalarFieldContainer[str]
    allow_fallback: bool
    slots_per_replica: int
    affinity_tag: str
    def __init__(self, binding_id: _Optional[str] = ..., role: _Optional[str] = ..., replicas: _Optional[int] = ..., preferred_pool: _Optional[str] = ..., preferred_kind: _Optional[_Union[_common_pb2.PoolKind, str]] = ..., hardware_tags: _Optional[_Iterable[str]] = ..., allow_fallback: _Optional[bool] = ..., slots_per_replica: _Optional[int] = ..., affinity_tag: _Optional[str] = ...) -> None: ...

class Binding(_message.Message):
    __slots__ = ("binding_id", "role", "replicas", "workers", "fallback", "degraded", "reason", "request", "updated_at")
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    binding_id: str
    role: str
    replicas: int
    workers: _containers.RepeatedCompositeFieldContainer[BoundWorker]
    fallback: bool
    degraded: bool
    reason: str
    request: BindRequest
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, binding_id: _Optional[str] = ..., role: _Optional[str] = ..., replicas: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[BoundWorker, _Mapping]]] = ..., fallback: _Optional[bool] = ..., degraded: _Optional[bool] = ..., reason: _Optional[str] = ..., request: _Optional[_Union[BindRequest, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class BoundWorker(_message.Message):
    __slots__ = ("worker_id", "endpoint", "pool", "hardware", "preferred")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    endpoint: str
    pool: str
    hardware: _common_pb2.Hardware
    preferred: bool
    def __init__(self, worker_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., pool: _Optional[str] = ..., hardware: _Optional[_Union[_common_pb2.Hardware, _Mapping]] = ..., preferred: _Optional[bool] = ...) -> None: ...

class UnbindRequest(_message.Message):
    __slots__ = ("binding_id",)
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    binding_id: str
    def __init__(self, binding_id: _Optional[str] = ...) -> None: ...

class GetBindingRequest(_message.Message):
    __slots__ = ("binding_id",)
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    binding_id: str
    def __init__(self, binding_id: _Optional[str] = ...) -> None: ...

class ListBindingsRequest(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: str
    def __init__(self, role: _Optional[str] = ...) -> None: ...

class ListBindingsResponse(_message.Message):
    __slots__ = ("bindings",)
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    bindings: _containers.RepeatedCompositeFieldContainer[Binding]
    def __init__(self, bindings: _Optional[_Iterable[_Union[Binding, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("from_revision", "types")
    FROM_REVISION_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    from_revision: int
    types: _containers.RepeatedScalarFieldContainer[ResourceEventType]
    def __init__(self, from_revision: _Optional[int] = ..., types: _Optional[_Iterable[_Union[ResourceEventType, str]]] = ...) -> None: ...

class ResourceEvent(_message.Message):
    __slots__ = ("revision", "type", "at", "pool", "worker", "binding")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    revision: int
    type: ResourceEventType
    at: _timestamp_pb2.Timestamp
    pool: Pool
    worker: Worker
    binding: Binding
    def __init__(self, revision: _Optional[int] = ..., type: _Optional[_Union[ResourceEventType, str]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pool: _Optional[_Union[Pool, _Mapping]] = ..., worker: _Optional[_Union[Worker, _Mapping]] = ..., binding: _Optional[_Union[Binding, _Mapping]] = ...) -> None: ...
