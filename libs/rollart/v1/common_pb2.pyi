import datetime

from google.protobuf import duration_pb2 as _duration_pb2
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

class AdmissionPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADMISSION_POLICY_UNSPECIFIED: _ClassVar[AdmissionPolicy]
    ADMISSION_POLICY_STRICT: _ClassVar[AdmissionPolicy]
    ADMISSION_POLICY_BOUNDED: _ClassVar[AdmissionPolicy]
    ADMISSION_POLICY_AT_START: _ClassVar[AdmissionPolicy]

class WeightArtifact(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_ARTIFACT_UNSPECIFIED: _ClassVar[WeightArtifact]
    WEIGHT_ARTIFACT_DELTA: _ClassVar[WeightArtifact]
    WEIGHT_ARTIFACT_BUCKETS: _ClassVar[WeightArtifact]
    WEIGHT_ARTIFACT_CHECKPOINT: _ClassVar[WeightArtifact]

class PdRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PD_ROLE_UNSPECIFIED: _ClassVar[PdRole]
    PD_ROLE_UNIFIED: _ClassVar[PdRole]
    PD_ROLE_PREFILL: _ClassVar[PdRole]
    PD_ROLE_DECODE: _ClassVar[PdRole]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORTED: _ClassVar[FinishReason]

class ScorerKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCORER_KIND_UNSPECIFIED: _ClassVar[ScorerKind]
    SCORER_KIND_MATH: _ClassVar[ScorerKind]
    SCORER_KIND_REASONING_GYM: _ClassVar[ScorerKind]
    SCORER_KIND_CODE: _ClassVar[ScorerKind]
    SCORER_KIND_GAME: _ClassVar[ScorerKind]
    SCORER_KIND_LLM_JUDGE: _ClassVar[ScorerKind]
    SCORER_KIND_CUSTOM: _ClassVar[ScorerKind]
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
ADMISSION_POLICY_UNSPECIFIED: AdmissionPolicy
ADMISSION_POLICY_STRICT: AdmissionPolicy
ADMISSION_POLICY_BOUNDED: AdmissionPolicy
ADMISSION_POLICY_AT_START: AdmissionPolicy
WEIGHT_ARTIFACT_UNSPECIFIED: WeightArtifact
WEIGHT_ARTIFACT_DELTA: WeightArtifact
WEIGHT_ARTIFACT_BUCKETS: WeightArtifact
WEIGHT_ARTIFACT_CHECKPOINT: WeightArtifact
PD_ROLE_UNSPECIFIED: PdRole
PD_ROLE_UNIFIED: PdRole
PD_ROLE_PREFILL: PdRole
PD_ROLE_DECODE: PdRole
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORTED: FinishReason
SCORER_KIND_UNSPECIFIED: ScorerKind
SCORER_KIND_MATH: ScorerKind
SCORER_KIND_REASONING_GYM: ScorerKind
SCORER_KIND_CODE: ScorerKind
SCORER_KIND_GAME: ScorerKind
SCORER_KIND_LLM_JUDGE: ScorerKind
SCORER_KIND_CUSTOM: ScorerKind

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

class GenerationFate(_message.Message):
    __slots__ = ("samples", "tokens")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    samples: int
    tokens: int
    def __init__(self, samples: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class GenerationAccounting(_message.Message):
    __slots__ = ("trained", "evicted", "cancelled", "rejected", "failed", "wasted_token_fraction", "filtered")
    TRAINED_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    WASTED_TOKEN_FRACTION_FIELD_NUMBER: _ClassVar[int]
    FILTERED_FIELD_NUMBER: _ClassVar[int]
    trained: GenerationFate
    evicted: GenerationFate
    cancelled: GenerationFate
    rejected: GenerationFate
    failed: GenerationFate
    wasted_token_fraction: float
    filtered: GenerationFate
    def __init__(self, trained: _Optional[_Union[GenerationFate, _Mapping]] = ..., evicted: _Optional[_Union[GenerationFate, _Mapping]] = ..., cancelled: _Optional[_Union[GenerationFate, _Mapping]] = ..., rejected: _Optional[_Union[GenerationFate, _Mapping]] = ..., failed: _Optional[_Union[GenerationFate, _Mapping]] = ..., wasted_token_fraction: _Optional[float] = ..., filtered: _Optional[_Union[GenerationFate, _Mapping]] = ...) -> None: ...

class DeltaSegment(_message.Message):
    __slots__ = ("job_id", "version", "base_version", "sequence", "trailer", "data")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TRAILER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    base_version: int
    sequence: int
    trailer: bool
    data: bytes
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ..., base_version: _Optional[int] = ..., sequence: _Optional[int] = ..., trailer: _Optional[bool] = ..., data: _Optional[bytes] = ...) -> None: ...

class StagedWeights(_message.Message):
    __slots__ = ("version", "base_version", "artifact", "hash", "parts_received", "parts_total", "bytes_received", "complete", "verified", "source", "started_at", "completed_at", "error")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    PARTS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    PARTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    version: int
    base_version: int
    artifact: WeightArtifact
    hash: bytes
    parts_received: int
    parts_total: int
    bytes_received: int
    complete: bool
    verified: bool
    source: str
    started_at: _timestamp_pb2.Timestamp
    completed_at: _timestamp_pb2.Timestamp
    error: str
    def __init__(self, version: _Optional[int] = ..., base_version: _Optional[int] = ..., artifact: _Optional[_Union[WeightArtifact, str]] = ..., hash: _Optional[bytes] = ..., parts_received: _Optional[int] = ..., parts_total: _Optional[int] = ..., bytes_received: _Optional[int] = ..., complete: _Optional[bool] = ..., verified: _Optional[bool] = ..., source: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class ActorWeightState(_message.Message):
    __slots__ = ("loaded", "active_version", "active_hash", "staged", "updating", "updating_to", "last_update_at", "last_pause")
    LOADED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_HASH_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    UPDATING_FIELD_NUMBER: _ClassVar[int]
    UPDATING_TO_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_PAUSE_FIELD_NUMBER: _ClassVar[int]
    loaded: bool
    active_version: int
    active_hash: bytes
    staged: _containers.RepeatedCompositeFieldContainer[StagedWeights]
    updating: bool
    updating_to: int
    last_update_at: _timestamp_pb2.Timestamp
    last_pause: _duration_pb2.Duration
    def __init__(self, loaded: _Optional[bool] = ..., active_version: _Optional[int] = ..., active_hash: _Optional[bytes] = ..., staged: _Optional[_Iterable[_Union[StagedWeights, _Mapping]]] = ..., updating: _Optional[bool] = ..., updating_to: _Optional[int] = ..., last_update_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_pause: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CommitOrder(_message.Message):
    __slots__ = ("order_id", "version", "hash", "base_version", "step", "actor_ids", "issued_at", "deadline", "fetch_if_missing")
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ACTOR_IDS_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    FETCH_IF_MISSING_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    version: int
    hash: bytes
    base_version: int
    step: int
    actor_ids: _containers.RepeatedScalarFieldContainer[str]
    issued_at: _timestamp_pb2.Timestamp
    deadline: _timestamp_pb2.Timestamp
    fetch_if_missing: bool
    def __init__(self, order_id: _Optional[str] = ..., version: _Optional[int] = ..., hash: _Optional[bytes] = ..., base_version: _Optional[int] = ..., step: _Optional[int] = ..., actor_ids: _Optional[_Iterable[str]] = ..., issued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., fetch_if_missing: _Optional[bool] = ...) -> None: ...

class ModelInput(_message.Message):
    __slots__ = ("token_ids", "messages", "text", "no_generation_prompt", "chat_template_kwargs")
    class ChatTemplateKwargsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    NO_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    text: str
    no_generation_prompt: bool
    chat_template_kwargs: _containers.ScalarMap[str, str]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., text: _Optional[str] = ..., no_generation_prompt: _Optional[bool] = ..., chat_template_kwargs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("input", "add_special_tokens")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input: ModelInput
    add_special_tokens: bool
    def __init__(self, input: _Optional[_Union[ModelInput, _Mapping]] = ..., add_special_tokens: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "rendered", "model", "max_model_len")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RENDERED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    rendered: str
    model: str
    max_model_len: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., rendered: _Optional[str] = ..., model: _Optional[str] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class VersionChange(_message.Message):
    __slots__ = ("token_index", "from_version", "to_version", "kv_recomputed", "recomputed_tokens", "paused")
    TOKEN_INDEX_FIELD_NUMBER: _ClassVar[int]
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    KV_RECOMPUTED_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    token_index: int
    from_version: int
    to_version: int
    kv_recomputed: bool
    recomputed_tokens: int
    paused: _duration_pb2.Duration
    def __init__(self, token_index: _Optional[int] = ..., from_version: _Optional[int] = ..., to_version: _Optional[int] = ..., kv_recomputed: _Optional[bool] = ..., recomputed_tokens: _Optional[int] = ..., paused: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class GenerationUsage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens", "queue_time", "time_to_first_token", "generation_time")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_TIME_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TIME_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    queue_time: _duration_pb2.Duration
    time_to_first_token: _duration_pb2.Duration
    generation_time: _duration_pb2.Duration
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., queue_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., time_to_first_token: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., generation_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class GenerationChunk(_message.Message):
    __slots__ = ("request_id", "trajectory_id", "actor_id", "offset", "token_ids", "logprobs", "versions", "text", "version_changes", "prompt_token_ids", "finish_reason", "stop_reason", "usage", "kv_transfer_params_json", "version_hashes")
    class VersionHashesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VERSION_CHANGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSION_HASHES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    trajectory_id: str
    actor_id: str
    offset: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    versions: _containers.RepeatedScalarFieldContainer[int]
    text: str
    version_changes: _containers.RepeatedCompositeFieldContainer[VersionChange]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    stop_reason: str
    usage: GenerationUsage
    kv_transfer_params_json: str
    version_hashes: _containers.ScalarMap[int, bytes]
    def __init__(self, request_id: _Optional[str] = ..., trajectory_id: _Optional[str] = ..., actor_id: _Optional[str] = ..., offset: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., versions: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., version_changes: _Optional[_Iterable[_Union[VersionChange, _Mapping]]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., stop_reason: _Optional[str] = ..., usage: _Optional[_Union[GenerationUsage, _Mapping]] = ..., kv_transfer_params_json: _Optional[str] = ..., version_hashes: _Optional[_Mapping[int, bytes]] = ...) -> None: ...

class RewardSpec(_message.Message):
    __slots__ = ("kind", "scorer", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    SCORER_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    kind: ScorerKind
    scorer: str
    options: _containers.ScalarMap[str, str]
    def __init__(self, kind: _Optional[_Union[ScorerKind, str]] = ..., scorer: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RewardOutcome(_message.Message):
    __slots__ = ("trajectory_id", "reward", "spec", "components", "explanation", "scored_at", "scoring_time")
    class ComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    SCORED_AT_FIELD_NUMBER: _ClassVar[int]
    SCORING_TIME_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    reward: float
    spec: RewardSpec
    components: _containers.ScalarMap[str, float]
    explanation: str
    scored_at: _timestamp_pb2.Timestamp
    scoring_time: _duration_pb2.Duration
    def __init__(self, trajectory_id: _Optional[str] = ..., reward: _Optional[float] = ..., spec: _Optional[_Union[RewardSpec, _Mapping]] = ..., components: _Optional[_Mapping[str, float]] = ..., explanation: _Optional[str] = ..., scored_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., scoring_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
