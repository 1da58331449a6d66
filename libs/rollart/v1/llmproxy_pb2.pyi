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

class RouteReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUTE_REASON_UNSPECIFIED: _ClassVar[RouteReason]
    ROUTE_REASON_STICKY: _ClassVar[RouteReason]
    ROUTE_REASON_PREFERRED: _ClassVar[RouteReason]
    ROUTE_REASON_LEAST_LOADED: _ClassVar[RouteReason]
    ROUTE_REASON_FALLBACK: _ClassVar[RouteReason]
    ROUTE_REASON_RETRY: _ClassVar[RouteReason]

class ProxyActorState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROXY_ACTOR_STATE_UNSPECIFIED: _ClassVar[ProxyActorState]
    PROXY_ACTOR_STATE_HEALTHY: _ClassVar[ProxyActorState]
    PROXY_ACTOR_STATE_UNHEALTHY: _ClassVar[ProxyActorState]
    PROXY_ACTOR_STATE_DRAINING: _ClassVar[ProxyActorState]

class ActorSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTOR_SOURCE_UNSPECIFIED: _ClassVar[ActorSource]
    ACTOR_SOURCE_BINDING: _ClassVar[ActorSource]
    ACTOR_SOURCE_STATIC: _ClassVar[ActorSource]
ROUTE_REASON_UNSPECIFIED: RouteReason
ROUTE_REASON_STICKY: RouteReason
ROUTE_REASON_PREFERRED: RouteReason
ROUTE_REASON_LEAST_LOADED: RouteReason
ROUTE_REASON_FALLBACK: RouteReason
ROUTE_REASON_RETRY: RouteReason
PROXY_ACTOR_STATE_UNSPECIFIED: ProxyActorState
PROXY_ACTOR_STATE_HEALTHY: ProxyActorState
PROXY_ACTOR_STATE_UNHEALTHY: ProxyActorState
PROXY_ACTOR_STATE_DRAINING: ProxyActorState
ACTOR_SOURCE_UNSPECIFIED: ActorSource
ACTOR_SOURCE_BINDING: ActorSource
ACTOR_SOURCE_STATIC: ActorSource

class TrajectoryGenerateRequest(_message.Message):
    __slots__ = ("trajectory_id", "request_id", "turn", "task", "input", "sampling", "deadline", "preferred_actor_id", "min_version", "lease_id", "return_text", "chunk_tokens", "job_id")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    RETURN_TEXT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    request_id: str
    turn: int
    task: str
    input: _common_pb2.ModelInput
    sampling: _common_pb2.SamplingParams
    deadline: _timestamp_pb2.Timestamp
    preferred_actor_id: str
    min_version: int
    lease_id: str
    return_text: bool
    chunk_tokens: int
    job_id: str
    def __init__(self, trajectory_id: _Optional[str] = ..., request_id: _Optional[str] = ..., turn: _Optional[int] = ..., task: _Optional[str] = ..., input: _Optional[_Union[_common_pb2.ModelInput, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., preferred_actor_id: _Optional[str] = ..., min_version: _Optional[int] = ..., lease_id: _Optional[str] = ..., return_text: _Optional[bool] = ..., chunk_tokens: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class RouteInfo(_message.Message):
    __slots__ = ("actor_id", "actor_endpoint", "pool", "reason", "prefill_actor_id", "actor_version", "admission_wait")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_WAIT_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    actor_endpoint: str
    pool: str
    reason: RouteReason
    prefill_actor_id: str
    actor_version: int
    admission_wait: _duration_pb2.Duration
    def __init__(self, actor_id: _Optional[str] = ..., actor_endpoint: _Optional[str] = ..., pool: _Optional[str] = ..., reason: _Optional[_Union[RouteReason, str]] = ..., prefill_actor_id: _Optional[str] = ..., actor_version: _Optional[int] = ..., admission_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class TrajectoryGenerateResponse(_message.Message):
    __slots__ = ("route", "chunk")
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    route: RouteInfo
    chunk: _common_pb2.GenerationChunk
    def __init__(self, route: _Optional[_Union[RouteInfo, _Mapping]] = ..., chunk: _Optional[_Union[_common_pb2.GenerationChunk, _Mapping]] = ...) -> None: ...

class ProxyTokenizeRequest(_message.Message):
    __slots__ = ("task", "request")
    TASK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    task: str
    request: _common_pb2.TokenizeRequest
    def __init__(self, task: _Optional[str] = ..., request: _Optional[_Union[_common_pb2.TokenizeRequest, _Mapping]] = ...) -> None: ...

class SuspendRequest(_message.Message):
    __slots__ = ("reason", "step", "job_id")
    REASON_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    reason: str
    step: int
    job_id: str
    def __init__(self, reason: _Optional[str] = ..., step: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("step", "job_id")
    STEP_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    step: int
    job_id: str
    def __init__(self, step: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class AdmissionState(_message.Message):
    __slots__ = ("suspended", "since", "reason", "waiting_requests", "in_flight_requests", "released", "suspended_for")
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FOR_FIELD_NUMBER: _ClassVar[int]
    suspended: bool
    since: _timestamp_pb2.Timestamp
    reason: str
    waiting_requests: int
    in_flight_requests: int
    released: int
    suspended_for: _duration_pb2.Duration
    def __init__(self, suspended: _Optional[bool] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., waiting_requests: _Optional[int] = ..., in_flight_requests: _Optional[int] = ..., released: _Optional[int] = ..., suspended_for: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ProxyAbortRequest(_message.Message):
    __slots__ = ("trajectory_ids", "reason")
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, trajectory_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ProxyAbortResponse(_message.Message):
    __slots__ = ("aborted_requests", "aborted_trajectory_ids")
    ABORTED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ABORTED_TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    aborted_requests: int
    aborted_trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, aborted_requests: _Optional[int] = ..., aborted_trajectory_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class VersionWindow(_message.Message):
    __slots__ = ("min_version", "max_version")
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSION_FIELD_NUMBER: _ClassVar[int]
    min_version: int
    max_version: int
    def __init__(self, min_version: _Optional[int] = ..., max_version: _Optional[int] = ...) -> None: ...

class SetVersionWindowRequest(_message.Message):
    __slots__ = ("window", "job_id")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    window: VersionWindow
    job_id: str
    def __init__(self, window: _Optional[_Union[VersionWindow, _Mapping]] = ..., job_id: _Optional[str] = ...) -> None: ...

class ProxyActor(_message.Message):
    __slots__ = ("actor_id", "endpoint", "pool", "region", "hardware", "pd_role", "state", "source", "binding_id", "active_version", "outstanding_requests", "outstanding_tokens", "sticky_trajectories", "tokens_per_s", "step_allocation", "last_error", "last_ok", "model", "ready", "version_known", "job_id", "job_versions")
    class JobVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    PD_ROLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STICKY_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    STEP_ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_OK_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    VERSION_KNOWN_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    endpoint: str
    pool: str
    region: str
    hardware: _common_pb2.Hardware
    pd_role: _common_pb2.PdRole
    state: ProxyActorState
    source: ActorSource
    binding_id: str
    active_version: int
    outstanding_requests: int
    outstanding_tokens: int
    sticky_trajectories: int
    tokens_per_s: float
    step_allocation: int
    last_error: str
    last_ok: _timestamp_pb2.Timestamp
    model: str
    ready: bool
    version_known: bool
    job_id: str
    job_versions: _containers.ScalarMap[str, int]
    def __init__(self, actor_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., pool: _Optional[str] = ..., region: _Optional[str] = ..., hardware: _Optional[_Union[_common_pb2.Hardware, _Mapping]] = ..., pd_role: _Optional[_Union[_common_pb2.PdRole, str]] = ..., state: _Optional[_Union[ProxyActorState, str]] = ..., source: _Optional[_Union[ActorSource, str]] = ..., binding_id: _Optional[str] = ..., active_version: _Optional[int] = ..., outstanding_requests: _Optional[int] = ..., outstanding_tokens: _Optional[int] = ..., sticky_trajectories: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., step_allocation: _Optional[int] = ..., last_error: _Optional[str] = ..., last_ok: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., model: _Optional[str] = ..., ready: _Optional[bool] = ..., version_known: _Optional[bool] = ..., job_id: _Optional[str] = ..., job_versions: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ListProxyActorsRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class ListProxyActorsResponse(_message.Message):
    __slots__ = ("actors",)
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    actors: _containers.RepeatedCompositeFieldContainer[ProxyActor]
    def __init__(self, actors: _Optional[_Iterable[_Union[ProxyActor, _Mapping]]] = ...) -> None: ...

class AddProxyActorRequest(_message.Message):
    __slots__ = ("actor_id", "endpoint", "pool", "hardware", "pd_role", "region")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    PD_ROLE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    endpoint: str
    pool: str
    hardware: _common_pb2.Hardware
    pd_role: _common_pb2.PdRole
    region: str
    def __init__(self, actor_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., pool: _Optional[str] = ..., hardware: _Optional[_Union[_common_pb2.Hardware, _Mapping]] = ..., pd_role: _Optional[_Union[_common_pb2.PdRole, str]] = ..., region: _Optional[str] = ...) -> None: ...

class RemoveProxyActorRequest(_message.Message):
    __slots__ = ("actor_id", "abort_in_flight")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    ABORT_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    abort_in_flight: bool
    def __init__(self, actor_id: _Optional[str] = ..., abort_in_flight: _Optional[bool] = ...) -> None: ...

class AffinityRule(_message.Message):
    __slots__ = ("task", "pool", "binding_id", "pool_kind", "hardware_tags", "allow_fallback", "from_binding", "auto")
    TASK_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    BINDING_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_KIND_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_TAGS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    FROM_BINDING_FIELD_NUMBER: _ClassVar[int]
    AUTO_FIELD_NUMBER: _ClassVar[int]
    task: str
    pool: str
    binding_id: str
    pool_kind: _common_pb2.PoolKind
    hardware_tags: _containers.RepeatedScalarFieldContainer[str]
    allow_fallback: bool
    from_binding: bool
    auto: bool
    def __init__(self, task: _Optional[str] = ..., pool: _Optional[str] = ..., binding_id: _Optional[str] = ..., pool_kind: _Optional[_Union[_common_pb2.PoolKind, str]] = ..., hardware_tags: _Optional[_Iterable[str]] = ..., allow_fallback: _Optional[bool] = ..., from_binding: _Optional[bool] = ..., auto: _Optional[bool] = ...) -> None: ...

class TaskProfile(_message.Message):
    __slots__ = ("task", "profile", "turns", "trajectories", "prefill_tokens_per_turn", "decode_tokens_per_turn", "turns_per_trajectory", "kind", "fallback_turns", "last_fallback")
    TASK_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_TURN_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_PER_TURN_FIELD_NUMBER: _ClassVar[int]
    TURNS_PER_TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_TURNS_FIELD_NUMBER: _ClassVar[int]
    LAST_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    task: str
    profile: str
    turns: int
    trajectories: int
    prefill_tokens_per_turn: float
    decode_tokens_per_turn: float
    turns_per_trajectory: float
    kind: _common_pb2.PoolKind
    fallback_turns: int
    last_fallback: str
    def __init__(self, task: _Optional[str] = ..., profile: _Optional[str] = ..., turns: _Optional[int] = ..., trajectories: _Optional[int] = ..., prefill_tokens_per_turn: _Optional[float] = ..., decode_tokens_per_turn: _Optional[float] = ..., turns_per_trajectory: _Optional[float] = ..., kind: _Optional[_Union[_common_pb2.PoolKind, str]] = ..., fallback_turns: _Optional[int] = ..., last_fallback: _Optional[str] = ...) -> None: ...

class AffinityTable(_message.Message):
    __slots__ = ("rules", "profiles")
    RULES_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[AffinityRule]
    profiles: _containers.RepeatedCompositeFieldContainer[TaskProfile]
    def __init__(self, rules: _Optional[_Iterable[_Union[AffinityRule, _Mapping]]] = ..., profiles: _Optional[_Iterable[_Union[TaskProfile, _Mapping]]] = ...) -> None: ...

class SetAffinityRequest(_message.Message):
    __slots__ = ("rules", "merge")
    RULES_FIELD_NUMBER: _ClassVar[int]
    MERGE_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[AffinityRule]
    merge: bool
    def __init__(self, rules: _Optional[_Iterable[_Union[AffinityRule, _Mapping]]] = ..., merge: _Optional[bool] = ...) -> None: ...

class GetAffinityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PdPoolConfig(_message.Message):
    __slots__ = ("pool", "enabled", "prefill_actor_ids", "decode_actor_ids", "kv_connector", "kv_connector_config_json", "min_prompt_tokens")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ACTOR_IDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_ACTOR_IDS_FIELD_NUMBER: _ClassVar[int]
    KV_CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    KV_CONNECTOR_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    MIN_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    enabled: bool
    prefill_actor_ids: _containers.RepeatedScalarFieldContainer[str]
    decode_actor_ids: _containers.RepeatedScalarFieldContainer[str]
    kv_connector: str
    kv_connector_config_json: str
    min_prompt_tokens: int
    def __init__(self, pool: _Optional[str] = ..., enabled: _Optional[bool] = ..., prefill_actor_ids: _Optional[_Iterable[str]] = ..., decode_actor_ids: _Optional[_Iterable[str]] = ..., kv_connector: _Optional[str] = ..., kv_connector_config_json: _Optional[str] = ..., min_prompt_tokens: _Optional[int] = ...) -> None: ...

class PdRouting(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PdPoolConfig]
    def __init__(self, pools: _Optional[_Iterable[_Union[PdPoolConfig, _Mapping]]] = ...) -> None: ...

class SetPdConfigRequest(_message.Message):
    __slots__ = ("pools", "merge")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    MERGE_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PdPoolConfig]
    merge: bool
    def __init__(self, pools: _Optional[_Iterable[_Union[PdPoolConfig, _Mapping]]] = ..., merge: _Optional[bool] = ...) -> None: ...

class GetPdConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProxyStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProxyStatus(_message.Message):
    __slots__ = ("admission", "actors", "healthy_actors", "sticky_trajectories", "requests_total", "actor_failures", "aborted_total", "version_window", "affinity", "pd", "openai_base_url", "plan_step")
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_ACTORS_FIELD_NUMBER: _ClassVar[int]
    STICKY_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FAILURES_FIELD_NUMBER: _ClassVar[int]
    ABORTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    VERSION_WINDOW_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_FIELD_NUMBER: _ClassVar[int]
    PD_FIELD_NUMBER: _ClassVar[int]
    OPENAI_BASE_URL_FIELD_NUMBER: _ClassVar[int]
    PLAN_STEP_FIELD_NUMBER: _ClassVar[int]
    admission: AdmissionState
    actors: int
    healthy_actors: int
    sticky_trajectories: int
    requests_total: int
    actor_failures: int
    aborted_total: int
    version_window: VersionWindow
    affinity: AffinityTable
    pd: PdRouting
    openai_base_url: str
    plan_step: int
    def __init__(self, admission: _Optional[_Union[AdmissionState, _Mapping]] = ..., actors: _Optional[int] = ..., healthy_actors: _Optional[int] = ..., sticky_trajectories: _Optional[int] = ..., requests_total: _Optional[int] = ..., actor_failures: _Optional[int] = ..., aborted_total: _Optional[int] = ..., version_window: _Optional[_Union[VersionWindow, _Mapping]] = ..., affinity: _Optional[_Union[AffinityTable, _Mapping]] = ..., pd: _Optional[_Union[PdRouting, _Mapping]] = ..., openai_base_url: _Optional[str] = ..., plan_step: _Optional[int] = ...) -> None: ...
