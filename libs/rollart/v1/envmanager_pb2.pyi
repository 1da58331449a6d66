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

class EnvSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENV_SOURCE_UNSPECIFIED: _ClassVar[EnvSource]
    ENV_SOURCE_REASONING_GYM: _ClassVar[EnvSource]
    ENV_SOURCE_GEM: _ClassVar[EnvSource]
    ENV_SOURCE_TEXTARENA: _ClassVar[EnvSource]
    ENV_SOURCE_GYMNASIUM: _ClassVar[EnvSource]
    ENV_SOURCE_CODE: _ClassVar[EnvSource]
    ENV_SOURCE_SWE: _ClassVar[EnvSource]
    ENV_SOURCE_CUSTOM: _ClassVar[EnvSource]

class SandboxBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SANDBOX_BACKEND_UNSPECIFIED: _ClassVar[SandboxBackend]
    SANDBOX_BACKEND_IN_PROCESS: _ClassVar[SandboxBackend]
    SANDBOX_BACKEND_PROCESS: _ClassVar[SandboxBackend]
    SANDBOX_BACKEND_BWRAP: _ClassVar[SandboxBackend]
    SANDBOX_BACKEND_DOCKER: _ClassVar[SandboxBackend]
    SANDBOX_BACKEND_KUBERNETES: _ClassVar[SandboxBackend]

class DistributionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DISTRIBUTION_KIND_UNSPECIFIED: _ClassVar[DistributionKind]
    DISTRIBUTION_KIND_NONE: _ClassVar[DistributionKind]
    DISTRIBUTION_KIND_CONSTANT: _ClassVar[DistributionKind]
    DISTRIBUTION_KIND_NORMAL: _ClassVar[DistributionKind]
    DISTRIBUTION_KIND_LOGNORMAL: _ClassVar[DistributionKind]
    DISTRIBUTION_KIND_UNIFORM: _ClassVar[DistributionKind]
    DISTRIBUTION_KIND_EXPONENTIAL: _ClassVar[DistributionKind]

class InteractionMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INTERACTION_MODE_UNSPECIFIED: _ClassVar[InteractionMode]
    INTERACTION_MODE_TRAJECTORY: _ClassVar[InteractionMode]
    INTERACTION_MODE_BATCH: _ClassVar[InteractionMode]

class LoopGroupState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOOP_GROUP_STATE_UNSPECIFIED: _ClassVar[LoopGroupState]
    LOOP_GROUP_STATE_RUNNING: _ClassVar[LoopGroupState]
    LOOP_GROUP_STATE_STOPPING: _ClassVar[LoopGroupState]
    LOOP_GROUP_STATE_STOPPED: _ClassVar[LoopGroupState]
    LOOP_GROUP_STATE_FAILED: _ClassVar[LoopGroupState]

class LoopStopMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOOP_STOP_MODE_UNSPECIFIED: _ClassVar[LoopStopMode]
    LOOP_STOP_MODE_GRACEFUL: _ClassVar[LoopStopMode]
    LOOP_STOP_MODE_ABORT: _ClassVar[LoopStopMode]

class LoopState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOOP_STATE_UNSPECIFIED: _ClassVar[LoopState]
    LOOP_STATE_STARTING: _ClassVar[LoopState]
    LOOP_STATE_ACQUIRING: _ClassVar[LoopState]
    LOOP_STATE_RESETTING: _ClassVar[LoopState]
    LOOP_STATE_GENERATING: _ClassVar[LoopState]
    LOOP_STATE_STEPPING: _ClassVar[LoopState]
    LOOP_STATE_CLOSING: _ClassVar[LoopState]
    LOOP_STATE_SETTLING: _ClassVar[LoopState]
    LOOP_STATE_BACKOFF: _ClassVar[LoopState]
    LOOP_STATE_STOPPED: _ClassVar[LoopState]
    LOOP_STATE_FAILED: _ClassVar[LoopState]
ENV_SOURCE_UNSPECIFIED: EnvSource
ENV_SOURCE_REASONING_GYM: EnvSource
ENV_SOURCE_GEM: EnvSource
ENV_SOURCE_TEXTARENA: EnvSource
ENV_SOURCE_GYMNASIUM: EnvSource
ENV_SOURCE_CODE: EnvSource
ENV_SOURCE_SWE: EnvSource
ENV_SOURCE_CUSTOM: EnvSource
SANDBOX_BACKEND_UNSPECIFIED: SandboxBackend
SANDBOX_BACKEND_IN_PROCESS: SandboxBackend
SANDBOX_BACKEND_PROCESS: SandboxBackend
SANDBOX_BACKEND_BWRAP: SandboxBackend
SANDBOX_BACKEND_DOCKER: SandboxBackend
SANDBOX_BACKEND_KUBERNETES: SandboxBackend
DISTRIBUTION_KIND_UNSPECIFIED: DistributionKind
DISTRIBUTION_KIND_NONE: DistributionKind
DISTRIBUTION_KIND_CONSTANT: DistributionKind
DISTRIBUTION_KIND_NORMAL: DistributionKind
DISTRIBUTION_KIND_LOGNORMAL: DistributionKind
DISTRIBUTION_KIND_UNIFORM: DistributionKind
DISTRIBUTION_KIND_EXPONENTIAL: DistributionKind
INTERACTION_MODE_UNSPECIFIED: InteractionMode
INTERACTION_MODE_TRAJECTORY: InteractionMode
INTERACTION_MODE_BATCH: InteractionMode
LOOP_GROUP_STATE_UNSPECIFIED: LoopGroupState
LOOP_GROUP_STATE_RUNNING: LoopGroupState
LOOP_GROUP_STATE_STOPPING: LoopGroupState
LOOP_GROUP_STATE_STOPPED: LoopGroupState
LOOP_GROUP_STATE_FAILED: LoopGroupState
LOOP_STOP_MODE_UNSPECIFIED: LoopStopMode
LOOP_STOP_MODE_GRACEFUL: LoopStopMode
LOOP_STOP_MODE_ABORT: LoopStopMode
LOOP_STATE_UNSPECIFIED: LoopState
LOOP_STATE_STARTING: LoopState
LOOP_STATE_ACQUIRING: LoopState
LOOP_STATE_RESETTING: LoopState
LOOP_STATE_GENERATING: LoopState
LOOP_STATE_STEPPING: LoopState
LOOP_STATE_CLOSING: LoopState
LOOP_STATE_SETTLING: LoopState
LOOP_STATE_BACKOFF: LoopState
LOOP_STATE_STOPPED: LoopState
LOOP_STATE_FAILED: LoopState

class SandboxSpec(_message.Message):
    __slots__ = ("backend", "image", "cpu_limit", "memory_mib", "pids_limit", "workspace_mib", "time_budget", "step_timeout", "writable_root", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    CPU_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    PIDS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_MIB_FIELD_NUMBER: _ClassVar[int]
    TIME_BUDGET_FIELD_NUMBER: _ClassVar[int]
    STEP_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    WRITABLE_ROOT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    backend: SandboxBackend
    image: str
    cpu_limit: float
    memory_mib: int
    pids_limit: int
    workspace_mib: int
    time_budget: _duration_pb2.Duration
    step_timeout: _duration_pb2.Duration
    writable_root: bool
    options: _containers.ScalarMap[str, str]
    def __init__(self, backend: _Optional[_Union[SandboxBackend, str]] = ..., image: _Optional[str] = ..., cpu_limit: _Optional[float] = ..., memory_mib: _Optional[int] = ..., pids_limit: _Optional[int] = ..., workspace_mib: _Optional[int] = ..., time_budget: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., step_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., writable_root: _Optional[bool] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class LatencyDistribution(_message.Message):
    __slots__ = ("kind", "mean", "stddev", "min", "max", "seed")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STDDEV_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    kind: DistributionKind
    mean: _duration_pb2.Duration
    stddev: _duration_pb2.Duration
    min: _duration_pb2.Duration
    max: _duration_pb2.Duration
    seed: int
    def __init__(self, kind: _Optional[_Union[DistributionKind, str]] = ..., mean: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., stddev: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., min: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., seed: _Optional[int] = ...) -> None: ...

class EnvironmentSpec(_message.Message):
    __slots__ = ("environment", "task", "options", "max_turns", "system_prompt", "sampling", "sandbox", "latency", "reward", "max_context_tokens", "generation_timeout", "interaction")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    INTERACTION_FIELD_NUMBER: _ClassVar[int]
    environment: str
    task: str
    options: _containers.ScalarMap[str, str]
    max_turns: int
    system_prompt: str
    sampling: _common_pb2.SamplingParams
    sandbox: SandboxSpec
    latency: LatencyDistribution
    reward: _common_pb2.RewardSpec
    max_context_tokens: int
    generation_timeout: _duration_pb2.Duration
    interaction: InteractionMode
    def __init__(self, environment: _Optional[str] = ..., task: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ..., max_turns: _Optional[int] = ..., system_prompt: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., sandbox: _Optional[_Union[SandboxSpec, _Mapping]] = ..., latency: _Optional[_Union[LatencyDistribution, _Mapping]] = ..., reward: _Optional[_Union[_common_pb2.RewardSpec, _Mapping]] = ..., max_context_tokens: _Optional[int] = ..., generation_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., interaction: _Optional[_Union[InteractionMode, str]] = ...) -> None: ...

class EnvironmentInfo(_message.Message):
    __slots__ = ("id", "source", "description", "multi_turn", "default_max_turns", "default_backend", "supported_backends", "default_reward", "options", "available", "unavailable_reason")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    MULTI_TURN_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_BACKEND_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_BACKENDS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_REWARD_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    source: EnvSource
    description: str
    multi_turn: bool
    default_max_turns: int
    default_backend: SandboxBackend
    supported_backends: _containers.RepeatedScalarFieldContainer[SandboxBackend]
    default_reward: _common_pb2.RewardSpec
    options: _containers.ScalarMap[str, str]
    available: bool
    unavailable_reason: str
    def __init__(self, id: _Optional[str] = ..., source: _Optional[_Union[EnvSource, str]] = ..., description: _Optional[str] = ..., multi_turn: _Optional[bool] = ..., default_max_turns: _Optional[int] = ..., default_backend: _Optional[_Union[SandboxBackend, str]] = ..., supported_backends: _Optional[_Iterable[_Union[SandboxBackend, str]]] = ..., default_reward: _Optional[_Union[_common_pb2.RewardSpec, _Mapping]] = ..., options: _Optional[_Mapping[str, str]] = ..., available: _Optional[bool] = ..., unavailable_reason: _Optional[str] = ...) -> None: ...

class ListEnvironmentsRequest(_message.Message):
    __slots__ = ("source", "include_unavailable")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    source: EnvSource
    include_unavailable: bool
    def __init__(self, source: _Optional[_Union[EnvSource, str]] = ..., include_unavailable: _Optional[bool] = ...) -> None: ...

class ListEnvironmentsResponse(_message.Message):
    __slots__ = ("environments",)
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentInfo]
    def __init__(self, environments: _Optional[_Iterable[_Union[EnvironmentInfo, _Mapping]]] = ...) -> None: ...

class StartLoopsRequest(_message.Message):
    __slots__ = ("group_id", "env", "count", "max_trajectories_per_loop", "holder_prefix", "lease_tasks")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_TRAJECTORIES_PER_LOOP_FIELD_NUMBER: _ClassVar[int]
    HOLDER_PREFIX_FIELD_NUMBER: _ClassVar[int]
    LEASE_TASKS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    env: EnvironmentSpec
    count: int
    max_trajectories_per_loop: int
    holder_prefix: str
    lease_tasks: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_id: _Optional[str] = ..., env: _Optional[_Union[EnvironmentSpec, _Mapping]] = ..., count: _Optional[int] = ..., max_trajectories_per_loop: _Optional[int] = ..., holder_prefix: _Optional[str] = ..., lease_tasks: _Optional[_Iterable[str]] = ...) -> None: ...

class LoopCounters(_message.Message):
    __slots__ = ("trajectories", "admitted", "rejected", "cancelled", "infra_failures", "timeouts", "turns", "tokens_generated")
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    INFRA_FAILURES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    trajectories: int
    admitted: int
    rejected: int
    cancelled: int
    infra_failures: int
    timeouts: int
    turns: int
    tokens_generated: int
    def __init__(self, trajectories: _Optional[int] = ..., admitted: _Optional[int] = ..., rejected: _Optional[int] = ..., cancelled: _Optional[int] = ..., infra_failures: _Optional[int] = ..., timeouts: _Optional[int] = ..., turns: _Optional[int] = ..., tokens_generated: _Optional[int] = ...) -> None: ...

class LoopGroup(_message.Message):
    __slots__ = ("group_id", "env", "count", "loop_ids", "state", "counters", "started_at")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LOOP_IDS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    env: EnvironmentSpec
    count: int
    loop_ids: _containers.RepeatedScalarFieldContainer[str]
    state: LoopGroupState
    counters: LoopCounters
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, group_id: _Optional[str] = ..., env: _Optional[_Union[EnvironmentSpec, _Mapping]] = ..., count: _Optional[int] = ..., loop_ids: _Optional[_Iterable[str]] = ..., state: _Optional[_Union[LoopGroupState, str]] = ..., counters: _Optional[_Union[LoopCounters, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class StopLoopsRequest(_message.Message):
    __slots__ = ("group_ids", "loop_ids", "mode", "wait")
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    LOOP_IDS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    loop_ids: _containers.RepeatedScalarFieldContainer[str]
    mode: LoopStopMode
    wait: bool
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ..., loop_ids: _Optional[_Iterable[str]] = ..., mode: _Optional[_Union[LoopStopMode, str]] = ..., wait: _Optional[bool] = ...) -> None: ...

class StopLoopsResponse(_message.Message):
    __slots__ = ("loop_ids", "leases_released", "stopped")
    LOOP_IDS_FIELD_NUMBER: _ClassVar[int]
    LEASES_RELEASED_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    loop_ids: _containers.RepeatedScalarFieldContainer[str]
    leases_released: int
    stopped: bool
    def __init__(self, loop_ids: _Optional[_Iterable[str]] = ..., leases_released: _Optional[int] = ..., stopped: _Optional[bool] = ...) -> None: ...

class ListLoopGroupsRequest(_message.Message):
    __slots__ = ("include_stopped",)
    INCLUDE_STOPPED_FIELD_NUMBER: _ClassVar[int]
    include_stopped: bool
    def __init__(self, include_stopped: _Optional[bool] = ...) -> None: ...

class ListLoopGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[LoopGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[LoopGroup, _Mapping]]] = ...) -> None: ...

class LoopStatus(_message.Message):
    __slots__ = ("loop_id", "group_id", "holder", "state", "state_since", "lease_id", "trajectory_id", "turn", "sandbox_id", "counters", "last_error")
    LOOP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_SINCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    loop_id: str
    group_id: str
    holder: str
    state: LoopState
    state_since: _timestamp_pb2.Timestamp
    lease_id: str
    trajectory_id: str
    turn: int
    sandbox_id: str
    counters: LoopCounters
    last_error: str
    def __init__(self, loop_id: _Optional[str] = ..., group_id: _Optional[str] = ..., holder: _Optional[str] = ..., state: _Optional[_Union[LoopState, str]] = ..., state_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_id: _Optional[str] = ..., trajectory_id: _Optional[str] = ..., turn: _Optional[int] = ..., sandbox_id: _Optional[str] = ..., counters: _Optional[_Union[LoopCounters, _Mapping]] = ..., last_error: _Optional[str] = ...) -> None: ...

class ListLoopsRequest(_message.Message):
    __slots__ = ("group_id", "states")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    states: _containers.RepeatedScalarFieldContainer[LoopState]
    def __init__(self, group_id: _Optional[str] = ..., states: _Optional[_Iterable[_Union[LoopState, str]]] = ...) -> None: ...

class ListLoopsResponse(_message.Message):
    __slots__ = ("loops",)
    LOOPS_FIELD_NUMBER: _ClassVar[int]
    loops: _containers.RepeatedCompositeFieldContainer[LoopStatus]
    def __init__(self, loops: _Optional[_Iterable[_Union[LoopStatus, _Mapping]]] = ...) -> None: ...

class TrajectoryInFlight(_message.Message):
    __slots__ = ("trajectory_id", "lease_id", "loop_id", "task", "environment", "prompt_id", "group_id", "sample_index", "lease_version", "turns", "tokens_generated", "versions", "actor_id", "state", "started_at", "lease_expires_at")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LOOP_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    lease_id: str
    loop_id: str
    task: str
    environment: str
    prompt_id: str
    group_id: str
    sample_index: int
    lease_version: int
    turns: int
    tokens_generated: int
    versions: _containers.RepeatedScalarFieldContainer[int]
    actor_id: str
    state: LoopState
    started_at: _timestamp_pb2.Timestamp
    lease_expires_at: _timestamp_pb2.Timestamp
    def __init__(self, trajectory_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., loop_id: _Optional[str] = ..., task: _Optional[str] = ..., environment: _Optional[str] = ..., prompt_id: _Optional[str] = ..., group_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., lease_version: _Optional[int] = ..., turns: _Optional[int] = ..., tokens_generated: _Optional[int] = ..., versions: _Optional[_Iterable[int]] = ..., actor_id: _Optional[str] = ..., state: _Optional[_Union[LoopState, str]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListTrajectoriesRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class ListTrajectoriesResponse(_message.Message):
    __slots__ = ("trajectories",)
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    trajectories: _containers.RepeatedCompositeFieldContainer[TrajectoryInFlight]
    def __init__(self, trajectories: _Optional[_Iterable[_Union[TrajectoryInFlight, _Mapping]]] = ...) -> None: ...

class AbortTrajectoriesRequest(_message.Message):
    __slots__ = ("trajectory_ids", "reason")
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, trajectory_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortTrajectoriesResponse(_message.Message):
    __slots__ = ("aborted",)
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    aborted: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, aborted: _Optional[_Iterable[str]] = ...) -> None: ...

class RunEpisodeRequest(_message.Message):
    __slots__ = ("env", "seed", "trajectory_id", "score", "prompt_text", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENV_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    env: EnvironmentSpec
    seed: int
    trajectory_id: str
    score: bool
    prompt_text: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, env: _Optional[_Union[EnvironmentSpec, _Mapping]] = ..., seed: _Optional[int] = ..., trajectory_id: _Optional[str] = ..., score: _Optional[bool] = ..., prompt_text: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RunEpisodeResponse(_message.Message):
    __slots__ = ("trajectory", "reward")
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    trajectory: _common_pb2.Trajectory
    reward: _common_pb2.RewardOutcome
    def __init__(self, trajectory: _Optional[_Union[_common_pb2.Trajectory, _Mapping]] = ..., reward: _Optional[_Union[_common_pb2.RewardOutcome, _Mapping]] = ...) -> None: ...

class EvalPrompt(_message.Message):
    __slots__ = ("seed", "options", "prompt_text", "metadata")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEED_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    seed: int
    options: _containers.ScalarMap[str, str]
    prompt_text: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, seed: _Optional[int] = ..., options: _Optional[_Mapping[str, str]] = ..., prompt_text: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EvaluateRequest(_message.Message):
    __slots__ = ("evaluation_id", "env", "prompts", "samples_per_prompt", "concurrency", "pass_threshold")
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    PASS_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    evaluation_id: str
    env: EnvironmentSpec
    prompts: _containers.RepeatedCompositeFieldContainer[EvalPrompt]
    samples_per_prompt: int
    concurrency: int
    pass_threshold: float
    def __init__(self, evaluation_id: _Optional[str] = ..., env: _Optional[_Union[EnvironmentSpec, _Mapping]] = ..., prompts: _Optional[_Iterable[_Union[EvalPrompt, _Mapping]]] = ..., samples_per_prompt: _Optional[int] = ..., concurrency: _Optional[int] = ..., pass_threshold: _Optional[float] = ...) -> None: ...

class EvalEpisode(_message.Message):
    __slots__ = ("prompt_index", "sample", "trajectory_id", "status", "reward", "passed", "failure_cause", "turns", "tokens_generated", "versions")
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CAUSE_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    prompt_index: int
    sample: int
    trajectory_id: str
    status: _common_pb2.TrajectoryStatus
    reward: float
    passed: bool
    failure_cause: str
    turns: int
    tokens_generated: int
    versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_index: _Optional[int] = ..., sample: _Optional[int] = ..., trajectory_id: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.TrajectoryStatus, str]] = ..., reward: _Optional[float] = ..., passed: _Optional[bool] = ..., failure_cause: _Optional[str] = ..., turns: _Optional[int] = ..., tokens_generated: _Optional[int] = ..., versions: _Optional[_Iterable[int]] = ...) -> None: ...

class EvaluateResponse(_message.Message):
    __slots__ = ("evaluation_id", "task", "prompts", "samples_per_prompt", "episodes_scored", "episodes_failed", "mean_at_n", "pass_at_n", "tokens_generated", "prompt_tokens", "min_version", "max_version", "elapsed", "failures_by_cause", "episodes")
    class FailuresByCauseEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    EVALUATION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    EPISODES_SCORED_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FAILED_FIELD_NUMBER: _ClassVar[int]
    MEAN_AT_N_FIELD_NUMBER: _ClassVar[int]
    PASS_AT_N_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSION_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_BY_CAUSE_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    evaluation_id: str
    task: str
    prompts: int
    samples_per_prompt: int
    episodes_scored: int
    episodes_failed: int
    mean_at_n: float
    pass_at_n: float
    tokens_generated: int
    prompt_tokens: int
    min_version: int
    max_version: int
    elapsed: _duration_pb2.Duration
    failures_by_cause: _containers.ScalarMap[str, int]
    episodes: _containers.RepeatedCompositeFieldContainer[EvalEpisode]
    def __init__(self, evaluation_id: _Optional[str] = ..., task: _Optional[str] = ..., prompts: _Optional[int] = ..., samples_per_prompt: _Optional[int] = ..., episodes_scored: _Optional[int] = ..., episodes_failed: _Optional[int] = ..., mean_at_n: _Optional[float] = ..., pass_at_n: _Optional[float] = ..., tokens_generated: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., min_version: _Optional[int] = ..., max_version: _Optional[int] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., failures_by_cause: _Optional[_Mapping[str, int]] = ..., episodes: _Optional[_Iterable[_Union[EvalEpisode, _Mapping]]] = ...) -> None: ...

class EnvManagerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnvManagerStatus(_message.Message):
    __slots__ = ("manager_id", "loops_active", "loops_by_state", "trajectories_in_flight", "sandboxes", "counters", "rewards_pending", "failures_by_cause", "started_at")
    class LoopsByStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class SandboxesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class FailuresByCauseEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MANAGER_ID_FIELD_NUMBER: _ClassVar[int]
    LOOPS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    LOOPS_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_PENDING_FIELD_NUMBER: _ClassVar[int]
    FAILURES_BY_CAUSE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    manager_id: str
    loops_active: int
    loops_by_state: _containers.ScalarMap[str, int]
    trajectories_in_flight: int
    sandboxes: _containers.ScalarMap[str, int]
    counters: LoopCounters
    rewards_pending: int
    failures_by_cause: _containers.ScalarMap[str, int]
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, manager_id: _Optional[str] = ..., loops_active: _Optional[int] = ..., loops_by_state: _Optional[_Mapping[str, int]] = ..., trajectories_in_flight: _Optional[int] = ..., sandboxes: _Optional[_Mapping[str, int]] = ..., counters: _Optional[_Union[LoopCounters, _Mapping]] = ..., rewards_pending: _Optional[int] = ..., failures_by_cause: _Optional[_Mapping[str, int]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
