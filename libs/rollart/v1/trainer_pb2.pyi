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

class StepMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_MODE_UNSPECIFIED: _ClassVar[StepMode]
    STEP_MODE_SYNC: _ClassVar[StepMode]
    STEP_MODE_ONE_OFF: _ClassVar[StepMode]
    STEP_MODE_ASYNC: _ClassVar[StepMode]
    STEP_MODE_AREAL: _ClassVar[StepMode]

class WeightSyncMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_SYNC_MODE_UNSPECIFIED: _ClassVar[WeightSyncMode]
    WEIGHT_SYNC_MODE_DELTA: _ClassVar[WeightSyncMode]
    WEIGHT_SYNC_MODE_BUCKETS: _ClassVar[WeightSyncMode]
    WEIGHT_SYNC_MODE_FULL_CHECKPOINT: _ClassVar[WeightSyncMode]

class TrainerBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAINER_BACKEND_UNSPECIFIED: _ClassVar[TrainerBackend]
    TRAINER_BACKEND_TORCH: _ClassVar[TrainerBackend]
    TRAINER_BACKEND_FSDP2: _ClassVar[TrainerBackend]
    TRAINER_BACKEND_MEGATRON: _ClassVar[TrainerBackend]

class TrainerJobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAINER_JOB_STATE_UNSPECIFIED: _ClassVar[TrainerJobState]
    TRAINER_JOB_STATE_STARTING: _ClassVar[TrainerJobState]
    TRAINER_JOB_STATE_RUNNING: _ClassVar[TrainerJobState]
    TRAINER_JOB_STATE_STOPPING: _ClassVar[TrainerJobState]
    TRAINER_JOB_STATE_STOPPED: _ClassVar[TrainerJobState]
    TRAINER_JOB_STATE_COMPLETED: _ClassVar[TrainerJobState]
    TRAINER_JOB_STATE_FAILED: _ClassVar[TrainerJobState]

class StepPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_PHASE_UNSPECIFIED: _ClassVar[StepPhase]
    STEP_PHASE_IDLE: _ClassVar[StepPhase]
    STEP_PHASE_GET_BATCH: _ClassVar[StepPhase]
    STEP_PHASE_SUSPEND: _ClassVar[StepPhase]
    STEP_PHASE_UPDATE: _ClassVar[StepPhase]
    STEP_PHASE_RESUME: _ClassVar[StepPhase]
    STEP_PHASE_TRAIN: _ClassVar[StepPhase]
    STEP_PHASE_PUBLISH: _ClassVar[StepPhase]
    STEP_PHASE_CHECKPOINT: _ClassVar[StepPhase]

class PublishState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUBLISH_STATE_UNSPECIFIED: _ClassVar[PublishState]
    PUBLISH_STATE_PUBLISHING: _ClassVar[PublishState]
    PUBLISH_STATE_PUBLISHED: _ClassVar[PublishState]
    PUBLISH_STATE_FAILED: _ClassVar[PublishState]

class StopMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_MODE_UNSPECIFIED: _ClassVar[StopMode]
    STOP_MODE_AFTER_STEP: _ClassVar[StopMode]
    STOP_MODE_NOW: _ClassVar[StopMode]
STEP_MODE_UNSPECIFIED: StepMode
STEP_MODE_SYNC: StepMode
STEP_MODE_ONE_OFF: StepMode
STEP_MODE_ASYNC: StepMode
STEP_MODE_AREAL: StepMode
WEIGHT_SYNC_MODE_UNSPECIFIED: WeightSyncMode
WEIGHT_SYNC_MODE_DELTA: WeightSyncMode
WEIGHT_SYNC_MODE_BUCKETS: WeightSyncMode
WEIGHT_SYNC_MODE_FULL_CHECKPOINT: WeightSyncMode
TRAINER_BACKEND_UNSPECIFIED: TrainerBackend
TRAINER_BACKEND_TORCH: TrainerBackend
TRAINER_BACKEND_FSDP2: TrainerBackend
TRAINER_BACKEND_MEGATRON: TrainerBackend
TRAINER_JOB_STATE_UNSPECIFIED: TrainerJobState
TRAINER_JOB_STATE_STARTING: TrainerJobState
TRAINER_JOB_STATE_RUNNING: TrainerJobState
TRAINER_JOB_STATE_STOPPING: TrainerJobState
TRAINER_JOB_STATE_STOPPED: TrainerJobState
TRAINER_JOB_STATE_COMPLETED: TrainerJobState
TRAINER_JOB_STATE_FAILED: TrainerJobState
STEP_PHASE_UNSPECIFIED: StepPhase
STEP_PHASE_IDLE: StepPhase
STEP_PHASE_GET_BATCH: StepPhase
STEP_PHASE_SUSPEND: StepPhase
STEP_PHASE_UPDATE: StepPhase
STEP_PHASE_RESUME: StepPhase
STEP_PHASE_TRAIN: StepPhase
STEP_PHASE_PUBLISH: StepPhase
STEP_PHASE_CHECKPOINT: StepPhase
PUBLISH_STATE_UNSPECIFIED: PublishState
PUBLISH_STATE_PUBLISHING: PublishState
PUBLISH_STATE_PUBLISHED: PublishState
PUBLISH_STATE_FAILED: PublishState
STOP_MODE_UNSPECIFIED: StopMode
STOP_MODE_AFTER_STEP: StopMode
STOP_MODE_NOW: StopMode

class GrpoConfig(_message.Message):
    __slots__ = ("learning_rate", "weight_decay", "clip_eps_low", "clip_eps_high", "kl_coef", "max_grad_norm", "normalize_advantage_std", "micro_batch_size", "epochs_per_batch", "max_seq_len", "loss_aggregation", "aggregation_length", "ratio_level", "entropy_coef", "advantage_estimator", "overlong_buffer", "overlong_max_tokens", "overlong_penalty", "correction", "correction_level", "is_cap", "mis_low", "mis_high", "proximal", "dynamic_sampling", "max_groups_per_batch")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    CLIP_EPS_LOW_FIELD_NUMBER: _ClassVar[int]
    CLIP_EPS_HIGH_FIELD_NUMBER: _ClassVar[int]
    KL_COEF_FIELD_NUMBER: _ClassVar[int]
    MAX_GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_ADVANTAGE_STD_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_PER_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    LOSS_AGGREGATION_FIELD_NUMBER: _ClassVar[int]
    AGGREGATION_LENGTH_FIELD_NUMBER: _ClassVar[int]
    RATIO_LEVEL_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_COEF_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGE_ESTIMATOR_FIELD_NUMBER: _ClassVar[int]
    OVERLONG_BUFFER_FIELD_NUMBER: _ClassVar[int]
    OVERLONG_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OVERLONG_PENALTY_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    IS_CAP_FIELD_NUMBER: _ClassVar[int]
    MIS_LOW_FIELD_NUMBER: _ClassVar[int]
    MIS_HIGH_FIELD_NUMBER: _ClassVar[int]
    PROXIMAL_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_GROUPS_PER_BATCH_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    weight_decay: float
    clip_eps_low: float
    clip_eps_high: float
    kl_coef: float
    max_grad_norm: float
    normalize_advantage_std: bool
    micro_batch_size: int
    epochs_per_batch: int
    max_seq_len: int
    loss_aggregation: str
    aggregation_length: int
    ratio_level: str
    entropy_coef: float
    advantage_estimator: str
    overlong_buffer: int
    overlong_max_tokens: int
    overlong_penalty: float
    correction: str
    correction_level: str
    is_cap: float
    mis_low: float
    mis_high: float
    proximal: str
    dynamic_sampling: bool
    max_groups_per_batch: int
    def __init__(self, learning_rate: _Optional[float] = ..., weight_decay: _Optional[float] = ..., clip_eps_low: _Optional[float] = ..., clip_eps_high: _Optional[float] = ..., kl_coef: _Optional[float] = ..., max_grad_norm: _Optional[float] = ..., normalize_advantage_std: _Optional[bool] = ..., micro_batch_size: _Optional[int] = ..., epochs_per_batch: _Optional[int] = ..., max_seq_len: _Optional[int] = ..., loss_aggregation: _Optional[str] = ..., aggregation_length: _Optional[int] = ..., ratio_level: _Optional[str] = ..., entropy_coef: _Optional[float] = ..., advantage_estimator: _Optional[str] = ..., overlong_buffer: _Optional[int] = ..., overlong_max_tokens: _Optional[int] = ..., overlong_penalty: _Optional[float] = ..., correction: _Optional[str] = ..., correction_level: _Optional[str] = ..., is_cap: _Optional[float] = ..., mis_low: _Optional[float] = ..., mis_high: _Optional[float] = ..., proximal: _Optional[str] = ..., dynamic_sampling: _Optional[bool] = ..., max_groups_per_batch: _Optional[int] = ...) -> None: ...

class PublishConfig(_message.Message):
    __slots__ = ("weight_sync", "checkpoint_every", "checkpoint_store", "relay_endpoints", "streams", "mooncake_master", "bucket_bytes", "dtype", "max_segment_bytes")
    WEIGHT_SYNC_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORE_FIELD_NUMBER: _ClassVar[int]
    RELAY_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    MOONCAKE_MASTER_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_SEGMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    weight_sync: WeightSyncMode
    checkpoint_every: int
    checkpoint_store: str
    relay_endpoints: _containers.RepeatedScalarFieldContainer[str]
    streams: int
    mooncake_master: str
    bucket_bytes: int
    dtype: str
    max_segment_bytes: int
    def __init__(self, weight_sync: _Optional[_Union[WeightSyncMode, str]] = ..., checkpoint_every: _Optional[int] = ..., checkpoint_store: _Optional[str] = ..., relay_endpoints: _Optional[_Iterable[str]] = ..., streams: _Optional[int] = ..., mooncake_master: _Optional[str] = ..., bucket_bytes: _Optional[int] = ..., dtype: _Optional[str] = ..., max_segment_bytes: _Optional[int] = ...) -> None: ...

class ParallelConfig(_message.Message):
    __slots__ = ("tensor_parallel_size", "pipeline_parallel_size")
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    tensor_parallel_size: int
    pipeline_parallel_size: int
    def __init__(self, tensor_parallel_size: _Optional[int] = ..., pipeline_parallel_size: _Optional[int] = ...) -> None: ...

class CheckpointConfig(_message.Message):
    __slots__ = ("uri", "every_steps", "keep_last", "resume")
    URI_FIELD_NUMBER: _ClassVar[int]
    EVERY_STEPS_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    uri: str
    every_steps: int
    keep_last: int
    resume: bool
    def __init__(self, uri: _Optional[str] = ..., every_steps: _Optional[int] = ..., keep_last: _Optional[int] = ..., resume: _Optional[bool] = ...) -> None: ...

class PromptSource(_message.Message):
    __slots__ = ("task", "environment", "seed", "dataset_uri", "reward", "metadata", "share")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DATASET_URI_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    task: str
    environment: str
    seed: int
    dataset_uri: str
    reward: _common_pb2.RewardSpec
    metadata: _containers.ScalarMap[str, str]
    share: float
    def __init__(self, task: _Optional[str] = ..., environment: _Optional[str] = ..., seed: _Optional[int] = ..., dataset_uri: _Optional[str] = ..., reward: _Optional[_Union[_common_pb2.RewardSpec, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., share: _Optional[float] = ...) -> None: ...

class TrainerEndpoints(_message.Message):
    __slots__ = ("ledger", "llmproxy", "resource_manager")
    LEDGER_FIELD_NUMBER: _ClassVar[int]
    LLMPROXY_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_MANAGER_FIELD_NUMBER: _ClassVar[int]
    ledger: str
    llmproxy: str
    resource_manager: str
    def __init__(self, ledger: _Optional[str] = ..., llmproxy: _Optional[str] = ..., resource_manager: _Optional[str] = ...) -> None: ...

class TrainerJobSpec(_message.Message):
    __slots__ = ("job_id", "model", "backend", "mode", "alpha", "admission", "batch_size", "group_size", "redundancy", "max_steps", "grpo", "publish", "checkpoint", "prompts", "endpoints", "sampling", "seed", "device", "batch_timeout", "metrics_path", "options", "parallel", "tasks", "lora")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    REDUNDANCY_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    GRPO_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    BATCH_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    METRICS_PATH_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    model: str
    backend: TrainerBackend
    mode: StepMode
    alpha: int
    admission: _common_pb2.AdmissionPolicy
    batch_size: int
    group_size: int
    redundancy: int
    max_steps: int
    grpo: GrpoConfig
    publish: PublishConfig
    checkpoint: CheckpointConfig
    prompts: PromptSource
    endpoints: TrainerEndpoints
    sampling: _common_pb2.SamplingParams
    seed: int
    device: str
    batch_timeout: _duration_pb2.Duration
    metrics_path: str
    options: _containers.ScalarMap[str, str]
    parallel: ParallelConfig
    tasks: _containers.RepeatedCompositeFieldContainer[PromptSource]
    lora: LoraConfig
    def __init__(self, job_id: _Optional[str] = ..., model: _Optional[str] = ..., backend: _Optional[_Union[TrainerBackend, str]] = ..., mode: _Optional[_Union[StepMode, str]] = ..., alpha: _Optional[int] = ..., admission: _Optional[_Union[_common_pb2.AdmissionPolicy, str]] = ..., batch_size: _Optional[int] = ..., group_size: _Optional[int] = ..., redundancy: _Optional[int] = ..., max_steps: _Optional[int] = ..., grpo: _Optional[_Union[GrpoConfig, _Mapping]] = ..., publish: _Optional[_Union[PublishConfig, _Mapping]] = ..., checkpoint: _Optional[_Union[CheckpointConfig, _Mapping]] = ..., prompts: _Optional[_Union[PromptSource, _Mapping]] = ..., endpoints: _Optional[_Union[TrainerEndpoints, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., seed: _Optional[int] = ..., device: _Optional[str] = ..., batch_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., metrics_path: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ..., parallel: _Optional[_Union[ParallelConfig, _Mapping]] = ..., tasks: _Optional[_Iterable[_Union[PromptSource, _Mapping]]] = ..., lora: _Optional[_Union[LoraConfig, _Mapping]] = ...) -> None: ...

class LoraConfig(_message.Message):
    __slots__ = ("rank", "alpha", "dropout", "target_modules", "trainable_modules")
    RANK_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_MODULES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    alpha: float
    dropout: float
    target_modules: _containers.RepeatedScalarFieldContainer[str]
    trainable_modules: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rank: _Optional[int] = ..., alpha: _Optional[float] = ..., dropout: _Optional[float] = ..., target_modules: _Optional[_Iterable[str]] = ..., trainable_modules: _Optional[_Iterable[str]] = ...) -> None: ...

class StepMetrics(_message.Message):
    __slots__ = ("step", "version_trained", "version_produced", "samples", "groups", "reward_mean", "reward_std", "reward_min", "reward_max", "loss", "pg_loss", "kl", "entropy", "clip_fraction", "grad_norm", "learning_rate", "tokens_trained", "response_length_mean", "staleness_mean", "staleness_max", "rollout_tokens_per_s", "get_batch_time", "suspend_time", "update_time", "resume_time", "train_time", "publish_time", "step_time", "update_pause", "actor_versions", "admitted", "rejected", "started_at", "finished_at", "extra", "accounting", "accounting_total", "checkpoint_time", "tasks")
    class ActorVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class TasksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TaskStepMetrics
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TaskStepMetrics, _Mapping]] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    VERSION_TRAINED_FIELD_NUMBER: _ClassVar[int]
    VERSION_PRODUCED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    REWARD_STD_FIELD_NUMBER: _ClassVar[int]
    REWARD_MIN_FIELD_NUMBER: _ClassVar[int]
    REWARD_MAX_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    PG_LOSS_FIELD_NUMBER: _ClassVar[int]
    KL_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    CLIP_FRACTION_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_TRAINED_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LENGTH_MEAN_FIELD_NUMBER: _ClassVar[int]
    STALENESS_MEAN_FIELD_NUMBER: _ClassVar[int]
    STALENESS_MAX_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    GET_BATCH_TIME_FIELD_NUMBER: _ClassVar[int]
    SUSPEND_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    RESUME_TIME_FIELD_NUMBER: _ClassVar[int]
    TRAIN_TIME_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_PAUSE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_TIME_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    step: int
    version_trained: int
    version_produced: int
    samples: int
    groups: int
    reward_mean: float
    reward_std: float
    reward_min: float
    reward_max: float
    loss: float
    pg_loss: float
    kl: float
    entropy: float
    clip_fraction: float
    grad_norm: float
    learning_rate: float
    tokens_trained: int
    response_length_mean: float
    staleness_mean: float
    staleness_max: int
    rollout_tokens_per_s: float
    get_batch_time: _duration_pb2.Duration
    suspend_time: _duration_pb2.Duration
    update_time: _duration_pb2.Duration
    resume_time: _duration_pb2.Duration
    train_time: _duration_pb2.Duration
    publish_time: _duration_pb2.Duration
    step_time: _duration_pb2.Duration
    update_pause: _duration_pb2.Duration
    actor_versions: _containers.ScalarMap[str, int]
    admitted: int
    rejected: int
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    extra: _containers.ScalarMap[str, float]
    accounting: _common_pb2.GenerationAccounting
    accounting_total: _common_pb2.GenerationAccounting
    checkpoint_time: _duration_pb2.Duration
    tasks: _containers.MessageMap[str, TaskStepMetrics]
    def __init__(self, step: _Optional[int] = ..., version_trained: _Optional[int] = ..., version_produced: _Optional[int] = ..., samples: _Optional[int] = ..., groups: _Optional[int] = ..., reward_mean: _Optional[float] = ..., reward_std: _Optional[float] = ..., reward_min: _Optional[float] = ..., reward_max: _Optional[float] = ..., loss: _Optional[float] = ..., pg_loss: _Optional[float] = ..., kl: _Optional[float] = ..., entropy: _Optional[float] = ..., clip_fraction: _Optional[float] = ..., grad_norm: _Optional[float] = ..., learning_rate: _Optional[float] = ..., tokens_trained: _Optional[int] = ..., response_length_mean: _Optional[float] = ..., staleness_mean: _Optional[float] = ..., staleness_max: _Optional[int] = ..., rollout_tokens_per_s: _Optional[float] = ..., get_batch_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., suspend_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., update_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., resume_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., train_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., publish_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., step_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., update_pause: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., actor_versions: _Optional[_Mapping[str, int]] = ..., admitted: _Optional[int] = ..., rejected: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., extra: _Optional[_Mapping[str, float]] = ..., accounting: _Optional[_Union[_common_pb2.GenerationAccounting, _Mapping]] = ..., accounting_total: _Optional[_Union[_common_pb2.GenerationAccounting, _Mapping]] = ..., checkpoint_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., tasks: _Optional[_Mapping[str, TaskStepMetrics]] = ...) -> None: ...

class TaskStepMetrics(_message.Message):
    __slots__ = ("samples", "groups", "batch_share", "reward_mean", "turns_mean", "tokens", "prompt_tokens")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SHARE_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    TURNS_MEAN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    samples: int
    groups: int
    batch_share: float
    reward_mean: float
    turns_mean: float
    tokens: int
    prompt_tokens: int
    def __init__(self, samples: _Optional[int] = ..., groups: _Optional[int] = ..., batch_share: _Optional[float] = ..., reward_mean: _Optional[float] = ..., turns_mean: _Optional[float] = ..., tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class PublishedVersion(_message.Message):
    __slots__ = ("version", "step", "state", "full_checkpoint", "extract_time", "stream_time", "checkpoint_time", "buckets_time", "relays", "egress_bytes", "started_at", "published_at", "error")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FULL_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    EXTRACT_TIME_FIELD_NUMBER: _ClassVar[int]
    STREAM_TIME_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_TIME_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_TIME_FIELD_NUMBER: _ClassVar[int]
    RELAYS_FIELD_NUMBER: _ClassVar[int]
    EGRESS_BYTES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    version: _common_pb2.PolicyVersion
    step: int
    state: PublishState
    full_checkpoint: bool
    extract_time: _duration_pb2.Duration
    stream_time: _duration_pb2.Duration
    checkpoint_time: _duration_pb2.Duration
    buckets_time: _duration_pb2.Duration
    relays: _containers.RepeatedScalarFieldContainer[str]
    egress_bytes: int
    started_at: _timestamp_pb2.Timestamp
    published_at: _timestamp_pb2.Timestamp
    error: str
    def __init__(self, version: _Optional[_Union[_common_pb2.PolicyVersion, _Mapping]] = ..., step: _Optional[int] = ..., state: _Optional[_Union[PublishState, str]] = ..., full_checkpoint: _Optional[bool] = ..., extract_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., stream_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., checkpoint_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., buckets_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., relays: _Optional[_Iterable[str]] = ..., egress_bytes: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., published_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class CheckpointInfo(_message.Message):
    __slots__ = ("checkpoint_id", "step", "version", "uri", "bytes", "includes_optimizer", "hash", "created_at")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    INCLUDES_OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    step: int
    version: int
    uri: str
    bytes: int
    includes_optimizer: bool
    hash: bytes
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, checkpoint_id: _Optional[str] = ..., step: _Optional[int] = ..., version: _Optional[int] = ..., uri: _Optional[str] = ..., bytes: _Optional[int] = ..., includes_optimizer: _Optional[bool] = ..., hash: _Optional[bytes] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TrainerJob(_message.Message):
    __slots__ = ("spec", "state", "current_step", "phase", "steps_completed", "policy_version", "latest_published_version", "last_step", "resumed_from", "started_at", "updated_at", "error")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEPS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_PUBLISHED_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    spec: TrainerJobSpec
    state: TrainerJobState
    current_step: int
    phase: StepPhase
    steps_completed: int
    policy_version: int
    latest_published_version: int
    last_step: StepMetrics
    resumed_from: CheckpointInfo
    started_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    error: str
    def __init__(self, spec: _Optional[_Union[TrainerJobSpec, _Mapping]] = ..., state: _Optional[_Union[TrainerJobState, str]] = ..., current_step: _Optional[int] = ..., phase: _Optional[_Union[StepPhase, str]] = ..., steps_completed: _Optional[int] = ..., policy_version: _Optional[int] = ..., latest_published_version: _Optional[int] = ..., last_step: _Optional[_Union[StepMetrics, _Mapping]] = ..., resumed_from: _Optional[_Union[CheckpointInfo, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ...) -> None: ...

class StartJobRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: TrainerJobSpec
    def __init__(self, spec: _Optional[_Union[TrainerJobSpec, _Mapping]] = ...) -> None: ...

class StopJobRequest(_message.Message):
    __slots__ = ("job_id", "mode", "checkpoint")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    mode: StopMode
    checkpoint: bool
    def __init__(self, job_id: _Optional[str] = ..., mode: _Optional[_Union[StopMode, str]] = ..., checkpoint: _Optional[bool] = ...) -> None: ...

class GetTrainerJobRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchTrainerJobRequest(_message.Message):
    __slots__ = ("from_step",)
    FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    from_step: int
    def __init__(self, from_step: _Optional[int] = ...) -> None: ...

class StepPhaseChange(_message.Message):
    __slots__ = ("step", "phase")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    step: int
    phase: StepPhase
    def __init__(self, step: _Optional[int] = ..., phase: _Optional[_Union[StepPhase, str]] = ...) -> None: ...

class TrainerEvent(_message.Message):
    __slots__ = ("at", "job", "phase", "step_finished", "version_published", "checkpoint_saved")
    AT_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_FINISHED_FIELD_NUMBER: _ClassVar[int]
    VERSION_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SAVED_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    job: TrainerJob
    phase: StepPhaseChange
    step_finished: StepMetrics
    version_published: PublishedVersion
    checkpoint_saved: CheckpointInfo
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., job: _Optional[_Union[TrainerJob, _Mapping]] = ..., phase: _Optional[_Union[StepPhaseChange, _Mapping]] = ..., step_finished: _Optional[_Union[StepMetrics, _Mapping]] = ..., version_published: _Optional[_Union[PublishedVersion, _Mapping]] = ..., checkpoint_saved: _Optional[_Union[CheckpointInfo, _Mapping]] = ...) -> None: ...

class GetCurrentVersionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CurrentVersionResponse(_message.Message):
    __slots__ = ("policy_version", "latest_published", "publishing")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    PUBLISHING_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    latest_published: _common_pb2.PolicyVersion
    publishing: bool
    def __init__(self, policy_version: _Optional[int] = ..., latest_published: _Optional[_Union[_common_pb2.PolicyVersion, _Mapping]] = ..., publishing: _Optional[bool] = ...) -> None: ...

class ListPublishedVersionsRequest(_message.Message):
    __slots__ = ("from_version", "limit")
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    from_version: int
    limit: int
    def __init__(self, from_version: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListPublishedVersionsResponse(_message.Message):
    __slots__ = ("versions",)
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[PublishedVersion]
    def __init__(self, versions: _Optional[_Iterable[_Union[PublishedVersion, _Mapping]]] = ...) -> None: ...

class GetStepMetricsRequest(_message.Message):
    __slots__ = ("from_step", "to_step")
    FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    TO_STEP_FIELD_NUMBER: _ClassVar[int]
    from_step: int
    to_step: int
    def __init__(self, from_step: _Optional[int] = ..., to_step: _Optional[int] = ...) -> None: ...

class GetStepMetricsResponse(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[StepMetrics]
    def __init__(self, steps: _Optional[_Iterable[_Union[StepMetrics, _Mapping]]] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("weights_only",)
    WEIGHTS_ONLY_FIELD_NUMBER: _ClassVar[int]
    weights_only: bool
    def __init__(self, weights_only: _Optional[bool] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointInfo]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[CheckpointInfo, _Mapping]]] = ...) -> None: ...
