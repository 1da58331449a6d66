import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PoolKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POOL_KIND_UNSPECIFIED: _ClassVar[PoolKind]
    POOL_KIND_GPU_COMPUTE: _ClassVar[PoolKind]
    POOL_KIND_GPU_BANDWIDTH: _ClassVar[PoolKind]
    POOL_KIND_CPU: _ClassVar[PoolKind]
    POOL_KIND_SERVERLESS: _ClassVar[PoolKind]

class TrajectoryStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAJECTORY_STATUS_UNSPECIFIED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_OK: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_CANCELLED: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_INFRA_FAILURE: _ClassVar[TrajectoryStatus]
    TRAJECTORY_STATUS_TIMEOUT: _ClassVar[TrajectoryStatus]
POOL_KIND_UNSPECIFIED: PoolKind
POOL_KIND_GPU_COMPUTE: PoolKind
POOL_KIND_GPU_BANDWIDTH: PoolKind
POOL_KIND_CPU: PoolKind
POOL_KIND_SERVERLESS: PoolKind
TRAJECTORY_STATUS_UNSPECIFIED: TrajectoryStatus
TRAJECTORY_STATUS_OK: TrajectoryStatus
TRAJECTORY_STATUS_CANCELLED: TrajectoryStatus
TRAJECTORY_STATUS_INFRA_FAILURE: TrajectoryStatus
TRAJECTORY_STATUS_TIMEOUT: TrajectoryStatus

class Hardware(_message.Message):
    __slots__ = ("accelerator", "count", "memory_gib", "tags")
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GIB_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    accelerator: str
    count: int
    memory_gib: float
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, accelerator: _Optional[str] = ..., count: _Optional[int] = ..., memory_gib: _Optional[float] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class PolicyVersion(_message.Message):
    __slots__ = ("version", "base_version", "hash", "checkpoint_uri", "delta_uri", "checkpoint_bytes", "delta_bytes", "delta_entries", "created_at", "bucket_keys")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    DELTA_URI_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    DELTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    DELTA_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    BUCKET_KEYS_FIELD_NUMBER: _ClassVar[int]
    version: int
    base_version: int
    hash: bytes
    checkpoint_uri: str
    delta_uri: str
    checkpoint_bytes: int
    delta_bytes: int
    delta_entries: int
    created_at: _timestamp_pb2.Timestamp
    bucket_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., base_version: _Optional[int] = ..., hash: _Optional[bytes] = ..., checkpoint_uri: _Optional[str] = ..., delta_uri: _Optional[str] = ..., checkpoint_bytes: _Optional[int] = ..., delta_bytes: _Optional[int] = ..., delta_entries: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., bucket_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens", "stop", "stop_token_ids", "seed", "logprobs", "repetition_penalty", "ignore_eos")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    seed: int
    logprobs: bool
    repetition_penalty: float
    ignore_eos: bool
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., seed: _Optional[int] = ..., logprobs: _Optional[bool] = ..., repetition_penalty: _Optional[float] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("observation", "observation_token_ids", "action", "action_token_ids", "action_logprobs", "action_versions", "env_reward", "actor_id")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ACTION_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ACTION_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ACTION_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ENV_REWARD_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    observation: str
    observation_token_ids: _containers.RepeatedScalarFieldContainer[int]
    action: str
    action_token_ids: _containers.RepeatedScalarFieldContainer[int]
    action_logprobs: _containers.RepeatedScalarFieldContainer[float]
    action_versions: _containers.RepeatedScalarFieldContainer[int]
    env_reward: float
    actor_id: str
    def __init__(self, observation: _Optional[str] = ..., observation_token_ids: _Optional[_Iterable[int]] = ..., action: _Optional[str] = ..., action_token_ids: _Optional[_Iterable[int]] = ..., action_logprobs: _Optional[_Iterable[float]] = ..., action_versions: _Optional[_Iterable[int]] = ..., env_reward: _Optional[float] = ..., actor_id: _Optional[str] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("trajectory_id", "lease_id", "prompt_id", "group_id", "sample_index", "task", "prompt_token_ids", "turns", "lease_version", "version_hashes", "reward", "scored", "status", "failure_cause", "metadata", "started_at", "finished_at")
    class VersionHashesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    LEASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_HASHES_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    SCORED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CAUSE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    lease_id: str
    prompt_id: str
    group_id: str
    sample_index: int
    task: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    lease_version: int
    version_hashes: _containers.ScalarMap[int, bytes]
    reward: float
    scored: bool
    status: TrajectoryStatus
    failure_cause: str
    metadata: _containers.ScalarMap[str, str]
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    def __init__(self, trajectory_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., group_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., task: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., lease_version: _Optional[int] = ..., version_hashes: _Optional[_Mapping[int, bytes]] = ..., reward: _Optional[float] = ..., scored: _Optional[bool] = ..., status: _Optional[_Union[TrajectoryStatus, str]] = ..., failure_cause: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Nothing(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
