import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from rollart.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCORE_STATUS_UNSPECIFIED: _ClassVar[ScoreStatus]
    SCORE_STATUS_OK: _ClassVar[ScoreStatus]
    SCORE_STATUS_FAILED: _ClassVar[ScoreStatus]
    SCORE_STATUS_TIMEOUT: _ClassVar[ScoreStatus]
    SCORE_STATUS_INVALID: _ClassVar[ScoreStatus]

class RewardPoolBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REWARD_POOL_BACKEND_UNSPECIFIED: _ClassVar[RewardPoolBackend]
    REWARD_POOL_BACKEND_PROCESS: _ClassVar[RewardPoolBackend]
    REWARD_POOL_BACKEND_KUBERNETES: _ClassVar[RewardPoolBackend]

class RewardWorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REWARD_WORKER_STATE_UNSPECIFIED: _ClassVar[RewardWorkerState]
    REWARD_WORKER_STATE_STARTING: _ClassVar[RewardWorkerState]
    REWARD_WORKER_STATE_IDLE: _ClassVar[RewardWorkerState]
    REWARD_WORKER_STATE_BUSY: _ClassVar[RewardWorkerState]
    REWARD_WORKER_STATE_STOPPING: _ClassVar[RewardWorkerState]
SCORE_STATUS_UNSPECIFIED: ScoreStatus
SCORE_STATUS_OK: ScoreStatus
SCORE_STATUS_FAILED: ScoreStatus
SCORE_STATUS_TIMEOUT: ScoreStatus
SCORE_STATUS_INVALID: ScoreStatus
REWARD_POOL_BACKEND_UNSPECIFIED: RewardPoolBackend
REWARD_POOL_BACKEND_PROCESS: RewardPoolBackend
REWARD_POOL_BACKEND_KUBERNETES: RewardPoolBackend
REWARD_WORKER_STATE_UNSPECIFIED: RewardWorkerState
REWARD_WORKER_STATE_STARTING: RewardWorkerState
REWARD_WORKER_STATE_IDLE: RewardWorkerState
REWARD_WORKER_STATE_BUSY: RewardWorkerState
REWARD_WORKER_STATE_STOPPING: RewardWorkerState

class ScoreRequest(_message.Message):
    __slots__ = ("trajectory", "spec", "timeout")
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    trajectory: _common_pb2.Trajectory
    spec: _common_pb2.RewardSpec
    timeout: _duration_pb2.Duration
    def __init__(self, trajectory: _Optional[_Union[_common_pb2.Trajectory, _Mapping]] = ..., spec: _Optional[_Union[_common_pb2.RewardSpec, _Mapping]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ScoreResult(_message.Message):
    __slots__ = ("trajectory_id", "status", "outcome", "error", "cached", "worker_id", "queue_time", "cause", "retryable", "attempts")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_TIME_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    status: ScoreStatus
    outcome: _common_pb2.RewardOutcome
    error: str
    cached: bool
    worker_id: str
    queue_time: _duration_pb2.Duration
    cause: str
    retryable: bool
    attempts: int
    def __init__(self, trajectory_id: _Optional[str] = ..., status: _Optional[_Union[ScoreStatus, str]] = ..., outcome: _Optional[_Union[_common_pb2.RewardOutcome, _Mapping]] = ..., error: _Optional[str] = ..., cached: _Optional[bool] = ..., worker_id: _Optional[str] = ..., queue_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., cause: _Optional[str] = ..., retryable: _Optional[bool] = ..., attempts: _Optional[int] = ...) -> None: ...

class ListScorersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ScorerInfo(_message.Message):
    __slots__ = ("kind", "name", "description", "options", "available")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    kind: _common_pb2.ScorerKind
    name: str
    description: str
    options: _containers.ScalarMap[str, str]
    available: bool
    def __init__(self, kind: _Optional[_Union[_common_pb2.ScorerKind, str]] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ..., available: _Optional[bool] = ...) -> None: ...

class ListScorersResponse(_message.Message):
    __slots__ = ("scorers",)
    SCORERS_FIELD_NUMBER: _ClassVar[int]
    scorers: _containers.RepeatedCompositeFieldContainer[ScorerInfo]
    def __init__(self, scorers: _Optional[_Iterable[_Union[ScorerInfo, _Mapping]]] = ...) -> None: ...

class RewardWorker(_message.Message):
    __slots__ = ("worker_id", "state", "handle", "trajectory_id", "scored", "started_at", "last_active")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    SCORED_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    state: RewardWorkerState
    handle: str
    trajectory_id: str
    scored: int
    started_at: _timestamp_pb2.Timestamp
    last_active: _timestamp_pb2.Timestamp
    def __init__(self, worker_id: _Optional[str] = ..., state: _Optional[_Union[RewardWorkerState, str]] = ..., handle: _Optional[str] = ..., trajectory_id: _Optional[str] = ..., scored: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_active: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RewardPoolStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RewardPoolStatus(_message.Message):
    __slots__ = ("backend", "workers", "min_workers", "max_workers", "idle_timeout", "queued", "in_flight", "scored_total", "cache_hits", "cache_entries", "scale_ups", "scale_downs", "last_scale_at")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    MIN_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SCORED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    CACHE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SCALE_UPS_FIELD_NUMBER: _ClassVar[int]
    SCALE_DOWNS_FIELD_NUMBER: _ClassVar[int]
    LAST_SCALE_AT_FIELD_NUMBER: _ClassVar[int]
    backend: RewardPoolBackend
    workers: _containers.RepeatedCompositeFieldContainer[RewardWorker]
    min_workers: int
    max_workers: int
    idle_timeout: _duration_pb2.Duration
    queued: int
    in_flight: int
    scored_total: int
    cache_hits: int
    cache_entries: int
    scale_ups: int
    scale_downs: int
    last_scale_at: _timestamp_pb2.Timestamp
    def __init__(self, backend: _Optional[_Union[RewardPoolBackend, str]] = ..., workers: _Optional[_Iterable[_Union[RewardWorker, _Mapping]]] = ..., min_workers: _Optional[int] = ..., max_workers: _Optional[int] = ..., idle_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., queued: _Optional[int] = ..., in_flight: _Optional[int] = ..., scored_total: _Optional[int] = ..., cache_hits: _Optional[int] = ..., cache_entries: _Optional[int] = ..., scale_ups: _Optional[int] = ..., scale_downs: _Optional[int] = ..., last_scale_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ConfigureRewardPoolRequest(_message.Message):
    __slots__ = ("min_workers", "max_workers", "idle_timeout")
    MIN_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    min_workers: int
    max_workers: int
    idle_timeout: _duration_pb2.Duration
    def __init__(self, min_workers: _Optional[int] = ..., max_workers: _Optional[int] = ..., idle_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
