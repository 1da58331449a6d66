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

class PdPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PD_PHASE_UNSPECIFIED: _ClassVar[PdPhase]
    PD_PHASE_FULL: _ClassVar[PdPhase]
    PD_PHASE_PREFILL: _ClassVar[PdPhase]
    PD_PHASE_DECODE: _ClassVar[PdPhase]

class PauseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAUSE_MODE_UNSPECIFIED: _ClassVar[PauseMode]
    PAUSE_MODE_KEEP: _ClassVar[PauseMode]
    PAUSE_MODE_WAIT: _ClassVar[PauseMode]
    PAUSE_MODE_ABORT: _ClassVar[PauseMode]
PD_PHASE_UNSPECIFIED: PdPhase
PD_PHASE_FULL: PdPhase
PD_PHASE_PREFILL: PdPhase
PD_PHASE_DECODE: PdPhase
PAUSE_MODE_UNSPECIFIED: PauseMode
PAUSE_MODE_KEEP: PauseMode
PAUSE_MODE_WAIT: PauseMode
PAUSE_MODE_ABORT: PauseMode

class ActorGenerateRequest(_message.Message):
    __slots__ = ("request_id", "trajectory_id", "input", "sampling", "min_version", "return_text", "chunk_tokens", "priority", "pd_phase", "kv_transfer_params_json", "job_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    RETURN_TEXT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PD_PHASE_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    trajectory_id: str
    input: _common_pb2.ModelInput
    sampling: _common_pb2.SamplingParams
    min_version: int
    return_text: bool
    chunk_tokens: int
    priority: int
    pd_phase: PdPhase
    kv_transfer_params_json: str
    job_id: str
    def __init__(self, request_id: _Optional[str] = ..., trajectory_id: _Optional[str] = ..., input: _Optional[_Union[_common_pb2.ModelInput, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., min_version: _Optional[int] = ..., return_text: _Optional[bool] = ..., chunk_tokens: _Optional[int] = ..., priority: _Optional[int] = ..., pd_phase: _Optional[_Union[PdPhase, str]] = ..., kv_transfer_params_json: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class ActorAbortRequest(_message.Message):
    __slots__ = ("request_ids", "trajectory_ids", "reason")
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ..., trajectory_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ActorAbortResponse(_message.Message):
    __slots__ = ("aborted_request_ids",)
    ABORTED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    aborted_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, aborted_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ActorPauseRequest(_message.Message):
    __slots__ = ("mode", "timeout", "reason")
    MODE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    mode: PauseMode
    timeout: _duration_pb2.Duration
    reason: str
    def __init__(self, mode: _Optional[_Union[PauseMode, str]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class ActorPauseResponse(_message.Message):
    __slots__ = ("state", "aborted", "kept")
    STATE_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    state: ActorPauseState
    aborted: int
    kept: int
    def __init__(self, state: _Optional[_Union[ActorPauseState, _Mapping]] = ..., aborted: _Optional[int] = ..., kept: _Optional[int] = ...) -> None: ...

class ActorResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ActorResumeResponse(_message.Message):
    __slots__ = ("state", "paused_for")
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FOR_FIELD_NUMBER: _ClassVar[int]
    state: ActorPauseState
    paused_for: _duration_pb2.Duration
    def __init__(self, state: _Optional[_Union[ActorPauseState, _Mapping]] = ..., paused_for: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ActorPauseState(_message.Message):
    __slots__ = ("paused", "mode", "since", "reason")
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    mode: PauseMode
    since: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, paused: _Optional[bool] = ..., mode: _Optional[_Union[PauseMode, str]] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class StageDeltaResponse(_message.Message):
    __slots__ = ("staged", "accepted", "duplicates")
    STAGED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    staged: _containers.RepeatedCompositeFieldContainer[_common_pb2.StagedWeights]
    accepted: int
    duplicates: int
    def __init__(self, staged: _Optional[_Iterable[_Union[_common_pb2.StagedWeights, _Mapping]]] = ..., accepted: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class GetStagingRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class GetStagingResponse(_message.Message):
    __slots__ = ("staged", "missing")
    class MissingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: SequenceList
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[SequenceList, _Mapping]] = ...) -> None: ...
    STAGED_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    staged: _containers.RepeatedCompositeFieldContainer[_common_pb2.StagedWeights]
    missing: _containers.MessageMap[int, SequenceList]
    def __init__(self, staged: _Optional[_Iterable[_Union[_common_pb2.StagedWeights, _Mapping]]] = ..., missing: _Optional[_Mapping[int, SequenceList]] = ...) -> None: ...

class SequenceList(_message.Message):
    __slots__ = ("sequences",)
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sequences: _Optional[_Iterable[int]] = ...) -> None: ...

class ActorCommitRequest(_message.Message):
    __slots__ = ("order", "no_wait", "job_id")
    ORDER_FIELD_NUMBER: _ClassVar[int]
    NO_WAIT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    order: _common_pb2.CommitOrder
    no_wait: bool
    job_id: str
    def __init__(self, order: _Optional[_Union[_common_pb2.CommitOrder, _Mapping]] = ..., no_wait: _Optional[bool] = ..., job_id: _Optional[str] = ...) -> None: ...

class AttachJobRequest(_message.Message):
    __slots__ = ("job_id", "job_key", "rank", "alpha", "target_modules", "weight_source", "ledger")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_KEY_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    job_key: bytes
    rank: int
    alpha: float
    target_modules: _containers.RepeatedScalarFieldContainer[str]
    weight_source: WeightSource
    ledger: str
    def __init__(self, job_id: _Optional[str] = ..., job_key: _Optional[bytes] = ..., rank: _Optional[int] = ..., alpha: _Optional[float] = ..., target_modules: _Optional[_Iterable[str]] = ..., weight_source: _Optional[_Union[WeightSource, _Mapping]] = ..., ledger: _Optional[str] = ...) -> None: ...

class AttachJobResponse(_message.Message):
    __slots__ = ("weights", "attached")
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    weights: _common_pb2.ActorWeightState
    attached: bool
    def __init__(self, weights: _Optional[_Union[_common_pb2.ActorWeightState, _Mapping]] = ..., attached: _Optional[bool] = ...) -> None: ...

class DetachJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DetachJobResponse(_message.Message):
    __slots__ = ("detached",)
    DETACHED_FIELD_NUMBER: _ClassVar[int]
    detached: bool
    def __init__(self, detached: _Optional[bool] = ...) -> None: ...

class ActorCommitResponse(_message.Message):
    __slots__ = ("result", "duplicate")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    result: WeightUpdateResult
    duplicate: bool
    def __init__(self, result: _Optional[_Union[WeightUpdateResult, _Mapping]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class WeightUpdateResult(_message.Message):
    __slots__ = ("from_version", "to_version", "hash", "artifact", "applied", "deltas_applied", "tensors_updated", "entries_applied", "bytes_loaded", "requests_recomputed", "recomputed_tokens", "prefix_cache_reset", "pause_window", "load_time", "completed_at")
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    DELTAS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    TENSORS_UPDATED_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    BYTES_LOADED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_RECOMPUTED_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_RESET_FIELD_NUMBER: _ClassVar[int]
    PAUSE_WINDOW_FIELD_NUMBER: _ClassVar[int]
    LOAD_TIME_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    from_version: int
    to_version: int
    hash: bytes
    artifact: _common_pb2.WeightArtifact
    applied: bool
    deltas_applied: int
    tensors_updated: int
    entries_applied: int
    bytes_loaded: int
    requests_recomputed: int
    recomputed_tokens: int
    prefix_cache_reset: bool
    pause_window: _duration_pb2.Duration
    load_time: _duration_pb2.Duration
    completed_at: _timestamp_pb2.Timestamp
    def __init__(self, from_version: _Optional[int] = ..., to_version: _Optional[int] = ..., hash: _Optional[bytes] = ..., artifact: _Optional[_Union[_common_pb2.WeightArtifact, str]] = ..., applied: _Optional[bool] = ..., deltas_applied: _Optional[int] = ..., tensors_updated: _Optional[int] = ..., entries_applied: _Optional[int] = ..., bytes_loaded: _Optional[int] = ..., requests_recomputed: _Optional[int] = ..., recomputed_tokens: _Optional[int] = ..., prefix_cache_reset: _Optional[bool] = ..., pause_window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., load_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LoadCheckpointRequest(_message.Message):
    __slots__ = ("uri", "version", "hash", "replay_to_version", "pause_mode")
    URI_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    REPLAY_TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MODE_FIELD_NUMBER: _ClassVar[int]
    uri: str
    version: int
    hash: bytes
    replay_to_version: int
    pause_mode: PauseMode
    def __init__(self, uri: _Optional[str] = ..., version: _Optional[int] = ..., hash: _Optional[bytes] = ..., replay_to_version: _Optional[int] = ..., pause_mode: _Optional[_Union[PauseMode, str]] = ...) -> None: ...

class PullBucketsRequest(_message.Message):
    __slots__ = ("version", "hash", "bucket_keys", "mooncake_master", "apply", "pause_mode")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    BUCKET_KEYS_FIELD_NUMBER: _ClassVar[int]
    MOONCAKE_MASTER_FIELD_NUMBER: _ClassVar[int]
    APPLY_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MODE_FIELD_NUMBER: _ClassVar[int]
    version: int
    hash: bytes
    bucket_keys: _containers.RepeatedScalarFieldContainer[str]
    mooncake_master: str
    apply: bool
    pause_mode: PauseMode
    def __init__(self, version: _Optional[int] = ..., hash: _Optional[bytes] = ..., bucket_keys: _Optional[_Iterable[str]] = ..., mooncake_master: _Optional[str] = ..., apply: _Optional[bool] = ..., pause_mode: _Optional[_Union[PauseMode, str]] = ...) -> None: ...

class PullBucketsResponse(_message.Message):
    __slots__ = ("staged", "applied", "pull_time")
    STAGED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    PULL_TIME_FIELD_NUMBER: _ClassVar[int]
    staged: _common_pb2.StagedWeights
    applied: WeightUpdateResult
    pull_time: _duration_pb2.Duration
    def __init__(self, staged: _Optional[_Union[_common_pb2.StagedWeights, _Mapping]] = ..., applied: _Optional[_Union[WeightUpdateResult, _Mapping]] = ..., pull_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ResetPrefixCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetPrefixCacheResponse(_message.Message):
    __slots__ = ("reset",)
    RESET_FIELD_NUMBER: _ClassVar[int]
    reset: bool
    def __init__(self, reset: _Optional[bool] = ...) -> None: ...

class WeightSource(_message.Message):
    __slots__ = ("relay_endpoint", "fallback_endpoints", "streams", "checkpoint_store", "mooncake_master", "active_endpoint", "connected")
    RELAY_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORE_FIELD_NUMBER: _ClassVar[int]
    MOONCAKE_MASTER_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    relay_endpoint: str
    fallback_endpoints: _containers.RepeatedScalarFieldContainer[str]
    streams: int
    checkpoint_store: str
    mooncake_master: str
    active_endpoint: str
    connected: bool
    def __init__(self, relay_endpoint: _Optional[str] = ..., fallback_endpoints: _Optional[_Iterable[str]] = ..., streams: _Optional[int] = ..., checkpoint_store: _Optional[str] = ..., mooncake_master: _Optional[str] = ..., active_endpoint: _Optional[str] = ..., connected: _Optional[bool] = ...) -> None: ...

class SetWeightSourceRequest(_message.Message):
    __slots__ = ("source",)
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    source: WeightSource
    def __init__(self, source: _Optional[_Union[WeightSource, _Mapping]] = ...) -> None: ...

class ActorStatusRequest(_message.Message):
    __slots__ = ("include_requests",)
    INCLUDE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    include_requests: bool
    def __init__(self, include_requests: _Optional[bool] = ...) -> None: ...

class ActorRequestInfo(_message.Message):
    __slots__ = ("request_id", "trajectory_id", "prompt_tokens", "generated_tokens", "started_at", "version")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    trajectory_id: str
    prompt_tokens: int
    generated_tokens: int
    started_at: _timestamp_pb2.Timestamp
    version: int
    def __init__(self, request_id: _Optional[str] = ..., trajectory_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., version: _Optional[int] = ...) -> None: ...

class ActorStatus(_message.Message):
    __slots__ = ("actor_id", "model", "engine", "endpoint", "pool", "region", "hardware", "pd_role", "ready", "weights", "weight_source", "pause", "running_requests", "waiting_requests", "in_flight_trajectories", "tokens_per_s", "generated_tokens_total", "prompt_tokens_total", "kv_cache_usage", "prefix_cache_hit_rate", "max_model_len", "requests", "last_update", "started_at", "last_update_error", "draining", "job_weights", "job_id")
    class JobWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _common_pb2.ActorWeightState
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_common_pb2.ActorWeightState, _Mapping]] = ...) -> None: ...
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    PD_ROLE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_ERROR_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    JOB_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    model: str
    engine: str
    endpoint: str
    pool: str
    region: str
    hardware: _common_pb2.Hardware
    pd_role: _common_pb2.PdRole
    ready: bool
    weights: _common_pb2.ActorWeightState
    weight_source: WeightSource
    pause: ActorPauseState
    running_requests: int
    waiting_requests: int
    in_flight_trajectories: int
    tokens_per_s: float
    generated_tokens_total: int
    prompt_tokens_total: int
    kv_cache_usage: float
    prefix_cache_hit_rate: float
    max_model_len: int
    requests: _containers.RepeatedCompositeFieldContainer[ActorRequestInfo]
    last_update: WeightUpdateResult
    started_at: _timestamp_pb2.Timestamp
    last_update_error: str
    draining: bool
    job_weights: _containers.MessageMap[str, _common_pb2.ActorWeightState]
    job_id: str
    def __init__(self, actor_id: _Optional[str] = ..., model: _Optional[str] = ..., engine: _Optional[str] = ..., endpoint: _Optional[str] = ..., pool: _Optional[str] = ..., region: _Optional[str] = ..., hardware: _Optional[_Union[_common_pb2.Hardware, _Mapping]] = ..., pd_role: _Optional[_Union[_common_pb2.PdRole, str]] = ..., ready: _Optional[bool] = ..., weights: _Optional[_Union[_common_pb2.ActorWeightState, _Mapping]] = ..., weight_source: _Optional[_Union[WeightSource, _Mapping]] = ..., pause: _Optional[_Union[ActorPauseState, _Mapping]] = ..., running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., in_flight_trajectories: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., generated_tokens_total: _Optional[int] = ..., prompt_tokens_total: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., prefix_cache_hit_rate: _Optional[float] = ..., max_model_len: _Optional[int] = ..., requests: _Optional[_Iterable[_Union[ActorRequestInfo, _Mapping]]] = ..., last_update: _Optional[_Union[WeightUpdateResult, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_update_error: _Optional[str] = ..., draining: _Optional[bool] = ..., job_weights: _Optional[_Mapping[str, _common_pb2.ActorWeightState]] = ..., job_id: _Optional[str] = ...) -> None: ...
