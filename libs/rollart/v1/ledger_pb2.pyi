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

class ActorLiveness(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTOR_LIVENESS_UNSPECIFIED: _ClassVar[ActorLiveness]
    ACTOR_LIVENESS_ALIVE: _ClassVar[ActorLiveness]
    ACTOR_LIVENESS_DRAINING: _ClassVar[ActorLiveness]
    ACTOR_LIVENESS_DEAD: _ClassVar[ActorLiveness]
    ACTOR_LIVENESS_LEFT: _ClassVar[ActorLiveness]

class ExclusionReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXCLUSION_REASON_UNSPECIFIED: _ClassVar[ExclusionReason]
    EXCLUSION_REASON_WRONG_VERSION: _ClassVar[ExclusionReason]
    EXCLUSION_REASON_DELTA_NOT_STAGED: _ClassVar[ExclusionReason]
    EXCLUSION_REASON_DEAD: _ClassVar[ExclusionReason]
    EXCLUSION_REASON_DRAINING: _ClassVar[ExclusionReason]
    EXCLUSION_REASON_ZERO_SHARE: _ClassVar[ExclusionReason]

class SubscriberKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBSCRIBER_KIND_UNSPECIFIED: _ClassVar[SubscriberKind]
    SUBSCRIBER_KIND_ACTOR: _ClassVar[SubscriberKind]
    SUBSCRIBER_KIND_RELAY: _ClassVar[SubscriberKind]
    SUBSCRIBER_KIND_HOLDER: _ClassVar[SubscriberKind]
    SUBSCRIBER_KIND_ROUTER: _ClassVar[SubscriberKind]
    SUBSCRIBER_KIND_TRAINER: _ClassVar[SubscriberKind]

class LeaseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_STATE_UNSPECIFIED: _ClassVar[LeaseState]
    LEASE_STATE_ACTIVE: _ClassVar[LeaseState]
    LEASE_STATE_SETTLED: _ClassVar[LeaseState]
    LEASE_STATE_REJECTED: _ClassVar[LeaseState]
    LEASE_STATE_EXPIRED: _ClassVar[LeaseState]
    LEASE_STATE_CANCELLED: _ClassVar[LeaseState]
    LEASE_STATE_RELEASED: _ClassVar[LeaseState]

class ReleaseReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RELEASE_REASON_UNSPECIFIED: _ClassVar[ReleaseReason]
    RELEASE_REASON_ABANDONED: _ClassVar[ReleaseReason]
    RELEASE_REASON_INFRA_FAILURE: _ClassVar[ReleaseReason]
    RELEASE_REASON_TIMEOUT: _ClassVar[ReleaseReason]
    RELEASE_REASON_SHUTDOWN: _ClassVar[ReleaseReason]
    RELEASE_REASON_CANCELLED: _ClassVar[ReleaseReason]

class CancelReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCEL_REASON_UNSPECIFIED: _ClassVar[CancelReason]
    CANCEL_REASON_GROUP_COMPLETE: _ClassVar[CancelReason]
    CANCEL_REASON_MANUAL: _ClassVar[CancelReason]
    CANCEL_REASON_STALE: _ClassVar[CancelReason]
    CANCEL_REASON_GROUP_DROPPED: _ClassVar[CancelReason]

class RejectionReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECTION_REASON_UNSPECIFIED: _ClassVar[RejectionReason]
    REJECTION_REASON_EXPIRED: _ClassVar[RejectionReason]
    REJECTION_REASON_STALE: _ClassVar[RejectionReason]
    REJECTION_REASON_HASH_MISMATCH: _ClassVar[RejectionReason]
    REJECTION_REASON_CANCELLED: _ClassVar[RejectionReason]
    REJECTION_REASON_UNKNOWN_LEASE: _ClassVar[RejectionReason]
    REJECTION_REASON_WRONG_HOLDER: _ClassVar[RejectionReason]
    REJECTION_REASON_ALREADY_SETTLED: _ClassVar[RejectionReason]
    REJECTION_REASON_UNKNOWN_VERSION: _ClassVar[RejectionReason]
    REJECTION_REASON_FAILED: _ClassVar[RejectionReason]
ACTOR_LIVENESS_UNSPECIFIED: ActorLiveness
ACTOR_LIVENESS_ALIVE: ActorLiveness
ACTOR_LIVENESS_DRAINING: ActorLiveness
ACTOR_LIVENESS_DEAD: ActorLiveness
ACTOR_LIVENESS_LEFT: ActorLiveness
EXCLUSION_REASON_UNSPECIFIED: ExclusionReason
EXCLUSION_REASON_WRONG_VERSION: ExclusionReason
EXCLUSION_REASON_DELTA_NOT_STAGED: ExclusionReason
EXCLUSION_REASON_DEAD: ExclusionReason
EXCLUSION_REASON_DRAINING: ExclusionReason
EXCLUSION_REASON_ZERO_SHARE: ExclusionReason
SUBSCRIBER_KIND_UNSPECIFIED: SubscriberKind
SUBSCRIBER_KIND_ACTOR: SubscriberKind
SUBSCRIBER_KIND_RELAY: SubscriberKind
SUBSCRIBER_KIND_HOLDER: SubscriberKind
SUBSCRIBER_KIND_ROUTER: SubscriberKind
SUBSCRIBER_KIND_TRAINER: SubscriberKind
LEASE_STATE_UNSPECIFIED: LeaseState
LEASE_STATE_ACTIVE: LeaseState
LEASE_STATE_SETTLED: LeaseState
LEASE_STATE_REJECTED: LeaseState
LEASE_STATE_EXPIRED: LeaseState
LEASE_STATE_CANCELLED: LeaseState
LEASE_STATE_RELEASED: LeaseState
RELEASE_REASON_UNSPECIFIED: ReleaseReason
RELEASE_REASON_ABANDONED: ReleaseReason
RELEASE_REASON_INFRA_FAILURE: ReleaseReason
RELEASE_REASON_TIMEOUT: ReleaseReason
RELEASE_REASON_SHUTDOWN: ReleaseReason
RELEASE_REASON_CANCELLED: ReleaseReason
CANCEL_REASON_UNSPECIFIED: CancelReason
CANCEL_REASON_GROUP_COMPLETE: CancelReason
CANCEL_REASON_MANUAL: CancelReason
CANCEL_REASON_STALE: CancelReason
CANCEL_REASON_GROUP_DROPPED: CancelReason
REJECTION_REASON_UNSPECIFIED: RejectionReason
REJECTION_REASON_EXPIRED: RejectionReason
REJECTION_REASON_STALE: RejectionReason
REJECTION_REASON_HASH_MISMATCH: RejectionReason
REJECTION_REASON_CANCELLED: RejectionReason
REJECTION_REASON_UNKNOWN_LEASE: RejectionReason
REJECTION_REASON_WRONG_HOLDER: RejectionReason
REJECTION_REASON_ALREADY_SETTLED: RejectionReason
REJECTION_REASON_UNKNOWN_VERSION: RejectionReason
REJECTION_REASON_FAILED: RejectionReason

class JobPolicy(_message.Message):
    __slots__ = ("job_id", "admission", "alpha", "group_size", "redundancy", "lease_ttl_multiplier", "initial_lease_ttl", "min_lease_ttl", "max_lease_ttl", "max_lease_attempts", "actor_timeout", "tau_ema_weight", "tau_decay", "initial_tau", "buffer_capacity", "command_retention", "task_shares", "uniform_allocation")
    class TaskSharesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    REDUNDANCY_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    INITIAL_LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    MIN_LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    MAX_LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    MAX_LEASE_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    TAU_EMA_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    TAU_DECAY_FIELD_NUMBER: _ClassVar[int]
    INITIAL_TAU_FIELD_NUMBER: _ClassVar[int]
    BUFFER_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    COMMAND_RETENTION_FIELD_NUMBER: _ClassVar[int]
    TASK_SHARES_FIELD_NUMBER: _ClassVar[int]
    UNIFORM_ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    admission: _common_pb2.AdmissionPolicy
    alpha: int
    group_size: int
    redundancy: int
    lease_ttl_multiplier: float
    initial_lease_ttl: _duration_pb2.Duration
    min_lease_ttl: _duration_pb2.Duration
    max_lease_ttl: _duration_pb2.Duration
    max_lease_attempts: int
    actor_timeout: _duration_pb2.Duration
    tau_ema_weight: float
    tau_decay: float
    initial_tau: float
    buffer_capacity: int
    command_retention: _duration_pb2.Duration
    task_shares: _containers.ScalarMap[str, float]
    uniform_allocation: bool
    def __init__(self, job_id: _Optional[str] = ..., admission: _Optional[_Union[_common_pb2.AdmissionPolicy, str]] = ..., alpha: _Optional[int] = ..., group_size: _Optional[int] = ..., redundancy: _Optional[int] = ..., lease_ttl_multiplier: _Optional[float] = ..., initial_lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., min_lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_lease_attempts: _Optional[int] = ..., actor_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., tau_ema_weight: _Optional[float] = ..., tau_decay: _Optional[float] = ..., initial_tau: _Optional[float] = ..., buffer_capacity: _Optional[int] = ..., command_retention: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., task_shares: _Optional[_Mapping[str, float]] = ..., uniform_allocation: _Optional[bool] = ...) -> None: ...

class SetJobPolicyRequest(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: JobPolicy
    def __init__(self, policy: _Optional[_Union[JobPolicy, _Mapping]] = ...) -> None: ...

class GetJobPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterVersionRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: _common_pb2.PolicyVersion
    def __init__(self, version: _Optional[_Union[_common_pb2.PolicyVersion, _Mapping]] = ...) -> None: ...

class RegisterVersionResponse(_message.Message):
    __slots__ = ("version", "created")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    version: _common_pb2.PolicyVersion
    created: bool
    def __init__(self, version: _Optional[_Union[_common_pb2.PolicyVersion, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetVersionRequest(_message.Message):
    __slots__ = ("version", "latest")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    version: int
    latest: bool
    def __init__(self, version: _Optional[int] = ..., latest: _Optional[bool] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ("from_version", "to_version", "limit")
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    from_version: int
    to_version: int
    limit: int
    def __init__(self, from_version: _Optional[int] = ..., to_version: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("versions", "latest_version")
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[_common_pb2.PolicyVersion]
    latest_version: int
    def __init__(self, versions: _Optional[_Iterable[_Union[_common_pb2.PolicyVersion, _Mapping]]] = ..., latest_version: _Optional[int] = ...) -> None: ...

class LedgerActor(_message.Message):
    __slots__ = ("actor_id", "endpoint", "region", "relay_id", "pool", "hardware", "weights", "tau", "liveness", "registered_at", "last_heartbeat", "in_flight_requests", "settled_tokens", "excluded_steps", "pd_role", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    RELAY_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TAU_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SETTLED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_STEPS_FIELD_NUMBER: _ClassVar[int]
    PD_ROLE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    endpoint: str
    region: str
    relay_id: str
    pool: str
    hardware: _common_pb2.Hardware
    weights: _common_pb2.ActorWeightState
    tau: float
    liveness: ActorLiveness
    registered_at: _timestamp_pb2.Timestamp
    last_heartbeat: _timestamp_pb2.Timestamp
    in_flight_requests: int
    settled_tokens: int
    excluded_steps: int
    pd_role: _common_pb2.PdRole
    labels: _containers.ScalarMap[str, str]
    def __init__(self, actor_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., region: _Optional[str] = ..., relay_id: _Optional[str] = ..., pool: _Optional[str] = ..., hardware: _Optional[_Union[_common_pb2.Hardware, _Mapping]] = ..., weights: _Optional[_Union[_common_pb2.ActorWeightState, _Mapping]] = ..., tau: _Optional[float] = ..., liveness: _Optional[_Union[ActorLiveness, str]] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_heartbeat: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., in_flight_requests: _Optional[int] = ..., settled_tokens: _Optional[int] = ..., excluded_steps: _Optional[int] = ..., pd_role: _Optional[_Union[_common_pb2.PdRole, str]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegisterActorRequest(_message.Message):
    __slots__ = ("actor",)
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    actor: LedgerActor
    def __init__(self, actor: _Optional[_Union[LedgerActor, _Mapping]] = ...) -> None: ...

class RegisterActorResponse(_message.Message):
    __slots__ = ("actor", "heartbeat_interval", "latest_version")
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    actor: LedgerActor
    heartbeat_interval: _duration_pb2.Duration
    latest_version: int
    def __init__(self, actor: _Optional[_Union[LedgerActor, _Mapping]] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., latest_version: _Optional[int] = ...) -> None: ...

class ActorHeartbeatRequest(_message.Message):
    __slots__ = ("actor_id", "weights", "observed_tokens_per_s", "in_flight_requests", "draining", "relay_id")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    RELAY_ID_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    weights: _common_pb2.ActorWeightState
    observed_tokens_per_s: float
    in_flight_requests: int
    draining: bool
    relay_id: str
    def __init__(self, actor_id: _Optional[str] = ..., weights: _Optional[_Union[_common_pb2.ActorWeightState, _Mapping]] = ..., observed_tokens_per_s: _Optional[float] = ..., in_flight_requests: _Optional[int] = ..., draining: _Optional[bool] = ..., relay_id: _Optional[str] = ...) -> None: ...

class ActorHeartbeatResponse(_message.Message):
    __slots__ = ("expires_at", "tau", "latest_command_sequence")
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    TAU_FIELD_NUMBER: _ClassVar[int]
    LATEST_COMMAND_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    expires_at: _timestamp_pb2.Timestamp
    tau: float
    latest_command_sequence: int
    def __init__(self, expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tau: _Optional[float] = ..., latest_command_sequence: _Optional[int] = ...) -> None: ...

class LeaveActorRequest(_message.Message):
    __slots__ = ("actor_id", "reason")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    reason: str
    def __init__(self, actor_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveActorResponse(_message.Message):
    __slots__ = ("leases_returned", "leases_unassigned")
    LEASES_RETURNED_FIELD_NUMBER: _ClassVar[int]
    LEASES_UNASSIGNED_FIELD_NUMBER: _ClassVar[int]
    leases_returned: int
    leases_unassigned: int
    def __init__(self, leases_returned: _Optional[int] = ..., leases_unassigned: _Optional[int] = ...) -> None: ...

class GetActorRequest(_message.Message):
    __slots__ = ("actor_id",)
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    def __init__(self, actor_id: _Optional[str] = ...) -> None: ...

class ListActorsRequest(_message.Message):
    __slots__ = ("include_inactive", "region")
    INCLUDE_INACTIVE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    include_inactive: bool
    region: str
    def __init__(self, include_inactive: _Optional[bool] = ..., region: _Optional[str] = ...) -> None: ...

class ListActorsResponse(_message.Message):
    __slots__ = ("actors",)
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    actors: _containers.RepeatedCompositeFieldContainer[LedgerActor]
    def __init__(self, actors: _Optional[_Iterable[_Union[LedgerActor, _Mapping]]] = ...) -> None: ...

class PlanStepRequest(_message.Message):
    __slots__ = ("step", "version", "batch_size", "commit_deadline")
    STEP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    step: int
    version: int
    batch_size: int
    commit_deadline: _timestamp_pb2.Timestamp
    def __init__(self, step: _Optional[int] = ..., version: _Optional[int] = ..., batch_size: _Optional[int] = ..., commit_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ActorAllocation(_message.Message):
    __slots__ = ("actor_id", "requests", "tau", "active_version", "needs_commit", "commit_order_id", "committed", "commit_error")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TAU_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEEDS_COMMIT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    COMMIT_ERROR_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    requests: int
    tau: float
    active_version: int
    needs_commit: bool
    commit_order_id: str
    committed: bool
    commit_error: str
    def __init__(self, actor_id: _Optional[str] = ..., requests: _Optional[int] = ..., tau: _Optional[float] = ..., active_version: _Optional[int] = ..., needs_commit: _Optional[bool] = ..., commit_order_id: _Optional[str] = ..., committed: _Optional[bool] = ..., commit_error: _Optional[str] = ...) -> None: ...

class ExcludedActor(_message.Message):
    __slots__ = ("actor_id", "reason", "active_version", "tau_after")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TAU_AFTER_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    reason: ExclusionReason
    active_version: int
    tau_after: float
    def __init__(self, actor_id: _Optional[str] = ..., reason: _Optional[_Union[ExclusionReason, str]] = ..., active_version: _Optional[int] = ..., tau_after: _Optional[float] = ...) -> None: ...

class StepPlan(_message.Message):
    __slots__ = ("step", "version", "version_hash", "batch_size", "total_tau", "allocations", "excluded", "planned_at", "commit_deadline", "all_committed")
    STEP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TAU_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    PLANNED_AT_FIELD_NUMBER: _ClassVar[int]
    COMMIT_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ALL_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    step: int
    version: int
    version_hash: bytes
    batch_size: int
    total_tau: float
    allocations: _containers.RepeatedCompositeFieldContainer[ActorAllocation]
    excluded: _containers.RepeatedCompositeFieldContainer[ExcludedActor]
    planned_at: _timestamp_pb2.Timestamp
    commit_deadline: _timestamp_pb2.Timestamp
    all_committed: bool
    def __init__(self, step: _Optional[int] = ..., version: _Optional[int] = ..., version_hash: _Optional[bytes] = ..., batch_size: _Optional[int] = ..., total_tau: _Optional[float] = ..., allocations: _Optional[_Iterable[_Union[ActorAllocation, _Mapping]]] = ..., excluded: _Optional[_Iterable[_Union[ExcludedActor, _Mapping]]] = ..., planned_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., commit_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., all_committed: _Optional[bool] = ...) -> None: ...

class GetStepPlanRequest(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class AwaitStepCommittedRequest(_message.Message):
    __slots__ = ("step", "wait")
    STEP_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    step: int
    wait: _duration_pb2.Duration
    def __init__(self, step: _Optional[int] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WatchCommandsRequest(_message.Message):
    __slots__ = ("subscriber_id", "kind", "from_sequence", "only_new")
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ONLY_NEW_FIELD_NUMBER: _ClassVar[int]
    subscriber_id: str
    kind: SubscriberKind
    from_sequence: int
    only_new: bool
    def __init__(self, subscriber_id: _Optional[str] = ..., kind: _Optional[_Union[SubscriberKind, str]] = ..., from_sequence: _Optional[int] = ..., only_new: _Optional[bool] = ...) -> None: ...

class CancelLeasesCommand(_message.Message):
    __slots__ = ("lease_ids", "trajectory_ids", "reason")
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    trajectory_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: CancelReason
    def __init__(self, lease_ids: _Optional[_Iterable[str]] = ..., trajectory_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[_Union[CancelReason, str]] = ...) -> None: ...

class DrainCommand(_message.Message):
    __slots__ = ("reason", "deadline")
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    deadline: _timestamp_pb2.Timestamp
    def __init__(self, reason: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class UndrainCommand(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class StageVersionCommand(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: _common_pb2.PolicyVersion
    def __init__(self, version: _Optional[_Union[_common_pb2.PolicyVersion, _Mapping]] = ...) -> None: ...

class SwitchRelayCommand(_message.Message):
    __slots__ = ("relay_id", "endpoint")
    RELAY_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    relay_id: str
    endpoint: str
    def __init__(self, relay_id: _Optional[str] = ..., endpoint: _Optional[str] = ...) -> None: ...

class VersionPublishedCommand(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: _common_pb2.PolicyVersion
    def __init__(self, version: _Optional[_Union[_common_pb2.PolicyVersion, _Mapping]] = ...) -> None: ...

class LedgerCommand(_message.Message):
    __slots__ = ("sequence", "issued_at", "target", "kinds", "ack_required", "commit", "cancel_leases", "drain", "undrain", "stage_version", "switch_relay", "version_published", "step_planned")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    ACK_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_LEASES_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    UNDRAIN_FIELD_NUMBER: _ClassVar[int]
    STAGE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SWITCH_RELAY_FIELD_NUMBER: _ClassVar[int]
    VERSION_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    STEP_PLANNED_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    issued_at: _timestamp_pb2.Timestamp
    target: str
    kinds: _containers.RepeatedScalarFieldContainer[SubscriberKind]
    ack_required: bool
    commit: _common_pb2.CommitOrder
    cancel_leases: CancelLeasesCommand
    drain: DrainCommand
    undrain: UndrainCommand
    stage_version: StageVersionCommand
    switch_relay: SwitchRelayCommand
    version_published: VersionPublishedCommand
    step_planned: StepPlan
    def __init__(self, sequence: _Optional[int] = ..., issued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., target: _Optional[str] = ..., kinds: _Optional[_Iterable[_Union[SubscriberKind, str]]] = ..., ack_required: _Optional[bool] = ..., commit: _Optional[_Union[_common_pb2.CommitOrder, _Mapping]] = ..., cancel_leases: _Optional[_Union[CancelLeasesCommand, _Mapping]] = ..., drain: _Optional[_Union[DrainCommand, _Mapping]] = ..., undrain: _Optional[_Union[UndrainCommand, _Mapping]] = ..., stage_version: _Optional[_Union[StageVersionCommand, _Mapping]] = ..., switch_relay: _Optional[_Union[SwitchRelayCommand, _Mapping]] = ..., version_published: _Optional[_Union[VersionPublishedCommand, _Mapping]] = ..., step_planned: _Optional[_Union[StepPlan, _Mapping]] = ...) -> None: ...

class AckCommandRequest(_message.Message):
    __slots__ = ("subscriber_id", "sequence", "ok", "error", "weights")
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    subscriber_id: str
    sequence: int
    ok: bool
    error: str
    weights: _common_pb2.ActorWeightState
    def __init__(self, subscriber_id: _Optional[str] = ..., sequence: _Optional[int] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., weights: _Optional[_Union[_common_pb2.ActorWeightState, _Mapping]] = ...) -> None: ...

class AckCommandResponse(_message.Message):
    __slots__ = ("recorded",)
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    recorded: bool
    def __init__(self, recorded: _Optional[bool] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("prompt_id", "task", "environment", "seed", "text", "messages", "reward", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    task: str
    environment: str
    seed: int
    text: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    reward: _common_pb2.RewardSpec
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, prompt_id: _Optional[str] = ..., task: _Optional[str] = ..., environment: _Optional[str] = ..., seed: _Optional[int] = ..., text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., reward: _Optional[_Union[_common_pb2.RewardSpec, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AddPromptsRequest(_message.Message):
    __slots__ = ("prompts", "group_size", "redundancy", "step", "priority", "group_ids")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    REDUNDANCY_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    group_size: int
    redundancy: int
    step: int
    priority: int
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., group_size: _Optional[int] = ..., redundancy: _Optional[int] = ..., step: _Optional[int] = ..., priority: _Optional[int] = ..., group_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AddPromptsResponse(_message.Message):
    __slots__ = ("group_ids", "groups_created", "samples_added")
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_CREATED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_ADDED_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    groups_created: int
    samples_added: int
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ..., groups_created: _Optional[int] = ..., samples_added: _Optional[int] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "prompt", "group_id", "sample_index", "version", "version_hash", "holder", "issued_at", "expires_at", "state", "attempt", "assigned_actor_id", "step", "trajectory_id", "rejection", "cancel_reason", "release_reason", "ended_at")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    REJECTION_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REASON_FIELD_NUMBER: _ClassVar[int]
    RELEASE_REASON_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    prompt: Prompt
    group_id: str
    sample_index: int
    version: int
    version_hash: bytes
    holder: str
    issued_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    state: LeaseState
    attempt: int
    assigned_actor_id: str
    step: int
    trajectory_id: str
    rejection: RejectionReason
    cancel_reason: CancelReason
    release_reason: ReleaseReason
    ended_at: _timestamp_pb2.Timestamp
    def __init__(self, lease_id: _Optional[str] = ..., prompt: _Optional[_Union[Prompt, _Mapping]] = ..., group_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., version: _Optional[int] = ..., version_hash: _Optional[bytes] = ..., holder: _Optional[str] = ..., issued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[LeaseState, str]] = ..., attempt: _Optional[int] = ..., assigned_actor_id: _Optional[str] = ..., step: _Optional[int] = ..., trajectory_id: _Optional[str] = ..., rejection: _Optional[_Union[RejectionReason, str]] = ..., cancel_reason: _Optional[_Union[CancelReason, str]] = ..., release_reason: _Optional[_Union[ReleaseReason, str]] = ..., ended_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AcquireLeasesRequest(_message.Message):
    __slots__ = ("holder", "max_leases", "tasks", "wait", "region", "group_id")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    MAX_LEASES_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    holder: str
    max_leases: int
    tasks: _containers.RepeatedScalarFieldContainer[str]
    wait: _duration_pb2.Duration
    region: str
    group_id: str
    def __init__(self, holder: _Optional[str] = ..., max_leases: _Optional[int] = ..., tasks: _Optional[_Iterable[str]] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., region: _Optional[str] = ..., group_id: _Optional[str] = ...) -> None: ...

class AcquireLeasesResponse(_message.Message):
    __slots__ = ("leases", "retry_after")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    retry_after: _duration_pb2.Duration
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class AcquireLeasesBatchRequest(_message.Message):
    __slots__ = ("requests", "wait")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[AcquireLeasesRequest]
    wait: _duration_pb2.Duration
    def __init__(self, requests: _Optional[_Iterable[_Union[AcquireLeasesRequest, _Mapping]]] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class BatchItemError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class AcquireLeasesBatchResult(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: AcquireLeasesResponse
    error: BatchItemError
    def __init__(self, response: _Optional[_Union[AcquireLeasesResponse, _Mapping]] = ..., error: _Optional[_Union[BatchItemError, _Mapping]] = ...) -> None: ...

class AcquireLeasesBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AcquireLeasesBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AcquireLeasesBatchResult, _Mapping]]] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "holder")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    holder: str
    def __init__(self, lease_id: _Optional[str] = ..., holder: _Optional[str] = ...) -> None: ...

class RenewLeaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class ReleaseLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "holder", "reason", "cause", "generated_tokens")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    holder: str
    reason: ReleaseReason
    cause: str
    generated_tokens: int
    def __init__(self, lease_id: _Optional[str] = ..., holder: _Optional[str] = ..., reason: _Optional[_Union[ReleaseReason, str]] = ..., cause: _Optional[str] = ..., generated_tokens: _Optional[int] = ...) -> None: ...

class CancelLeasesRequest(_message.Message):
    __slots__ = ("lease_ids", "group_ids", "reason")
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: CancelReason
    def __init__(self, lease_ids: _Optional[_Iterable[str]] = ..., group_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[_Union[CancelReason, str]] = ...) -> None: ...

class CancelLeasesResponse(_message.Message):
    __slots__ = ("cancelled_lease_ids",)
    CANCELLED_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    cancelled_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cancelled_lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ListLeasesRequest(_message.Message):
    __slots__ = ("states", "holder", "group_id", "page_size", "page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[LeaseState]
    holder: str
    group_id: str
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[LeaseState, str]]] = ..., holder: _Optional[str] = ..., group_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListLeasesResponse(_message.Message):
    __slots__ = ("leases", "next_page_token")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    next_page_token: str
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ActorWork(_message.Message):
    __slots__ = ("actor_id", "tokens", "generation_time")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TIME_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    tokens: int
    generation_time: _duration_pb2.Duration
    def __init__(self, actor_id: _Optional[str] = ..., tokens: _Optional[int] = ..., generation_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("trajectory", "holder", "work", "reward")
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    trajectory: _common_pb2.Trajectory
    holder: str
    work: _containers.RepeatedCompositeFieldContainer[ActorWork]
    reward: _common_pb2.RewardOutcome
    def __init__(self, trajectory: _Optional[_Union[_common_pb2.Trajectory, _Mapping]] = ..., holder: _Optional[str] = ..., work: _Optional[_Iterable[_Union[ActorWork, _Mapping]]] = ..., reward: _Optional[_Union[_common_pb2.RewardOutcome, _Mapping]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("admitted", "reason", "detail", "duplicate", "lease", "group_complete", "group_admitted", "awaiting_reward")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    GROUP_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    AWAITING_REWARD_FIELD_NUMBER: _ClassVar[int]
    admitted: bool
    reason: RejectionReason
    detail: str
    duplicate: bool
    lease: Lease
    group_complete: bool
    group_admitted: int
    awaiting_reward: bool
    def __init__(self, admitted: _Optional[bool] = ..., reason: _Optional[_Union[RejectionReason, str]] = ..., detail: _Optional[str] = ..., duplicate: _Optional[bool] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., group_complete: _Optional[bool] = ..., group_admitted: _Optional[int] = ..., awaiting_reward: _Optional[bool] = ...) -> None: ...

class SubmitBatchRequest(_message.Message):
    __slots__ = ("submissions",)
    SUBMISSIONS_FIELD_NUMBER: _ClassVar[int]
    submissions: _containers.RepeatedCompositeFieldContainer[SubmitRequest]
    def __init__(self, submissions: _Optional[_Iterable[_Union[SubmitRequest, _Mapping]]] = ...) -> None: ...

class SubmitBatchResult(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: SubmitResponse
    error: BatchItemError
    def __init__(self, response: _Optional[_Union[SubmitResponse, _Mapping]] = ..., error: _Optional[_Union[BatchItemError, _Mapping]] = ...) -> None: ...

class SubmitBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SubmitBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SubmitBatchResult, _Mapping]]] = ...) -> None: ...

class RecordRewardRequest(_message.Message):
    __slots__ = ("trajectory_id", "reward", "failed", "failure_cause")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CAUSE_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    reward: _common_pb2.RewardOutcome
    failed: bool
    failure_cause: str
    def __init__(self, trajectory_id: _Optional[str] = ..., reward: _Optional[_Union[_common_pb2.RewardOutcome, _Mapping]] = ..., failed: _Optional[bool] = ..., failure_cause: _Optional[str] = ...) -> None: ...

class RecordRewardResponse(_message.Message):
    __slots__ = ("recorded", "reward", "unknown_trajectory", "group_ready")
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    GROUP_READY_FIELD_NUMBER: _ClassVar[int]
    recorded: bool
    reward: float
    unknown_trajectory: bool
    group_ready: bool
    def __init__(self, recorded: _Optional[bool] = ..., reward: _Optional[float] = ..., unknown_trajectory: _Optional[bool] = ..., group_ready: _Optional[bool] = ...) -> None: ...

class ListUnscoredRequest(_message.Message):
    __slots__ = ("holder_prefix", "max_samples", "page_token")
    HOLDER_PREFIX_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    holder_prefix: str
    max_samples: int
    page_token: str
    def __init__(self, holder_prefix: _Optional[str] = ..., max_samples: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class UnscoredSample(_message.Message):
    __slots__ = ("lease", "trajectory", "admitted_at")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    trajectory: _common_pb2.Trajectory
    admitted_at: _timestamp_pb2.Timestamp
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., trajectory: _Optional[_Union[_common_pb2.Trajectory, _Mapping]] = ..., admitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListUnscoredResponse(_message.Message):
    __slots__ = ("samples", "next_page_token")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[UnscoredSample]
    next_page_token: str
    def __init__(self, samples: _Optional[_Iterable[_Union[UnscoredSample, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetBatchRequest(_message.Message):
    __slots__ = ("step", "batch_size", "current_version", "wait", "allow_partial", "drop_zero_variance", "max_groups")
    STEP_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    DROP_ZERO_VARIANCE_FIELD_NUMBER: _ClassVar[int]
    MAX_GROUPS_FIELD_NUMBER: _ClassVar[int]
    step: int
    batch_size: int
    current_version: int
    wait: _duration_pb2.Duration
    allow_partial: bool
    drop_zero_variance: bool
    max_groups: int
    def __init__(self, step: _Optional[int] = ..., batch_size: _Optional[int] = ..., current_version: _Optional[int] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., allow_partial: _Optional[bool] = ..., drop_zero_variance: _Optional[bool] = ..., max_groups: _Optional[int] = ...) -> None: ...

class SampleGroup(_message.Message):
    __slots__ = ("group_id", "prompt_id", "trajectories")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    prompt_id: str
    trajectories: _containers.RepeatedCompositeFieldContainer[_common_pb2.Trajectory]
    def __init__(self, group_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., trajectories: _Optional[_Iterable[_Union[_common_pb2.Trajectory, _Mapping]]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("batch_id", "step", "groups", "samples", "min_version", "max_version", "evicted", "waited", "partial", "evicted_tokens", "accounting", "filtered_groups", "filtered_samples", "filtered_tokens")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSION_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    WAITED_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    EVICTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    FILTERED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    FILTERED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    FILTERED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    step: int
    groups: _containers.RepeatedCompositeFieldContainer[SampleGroup]
    samples: int
    min_version: int
    max_version: int
    evicted: int
    waited: _duration_pb2.Duration
    partial: bool
    evicted_tokens: int
    accounting: _common_pb2.GenerationAccounting
    filtered_groups: int
    filtered_samples: int
    filtered_tokens: int
    def __init__(self, batch_id: _Optional[str] = ..., step: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[SampleGroup, _Mapping]]] = ..., samples: _Optional[int] = ..., min_version: _Optional[int] = ..., max_version: _Optional[int] = ..., evicted: _Optional[int] = ..., waited: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., partial: _Optional[bool] = ..., evicted_tokens: _Optional[int] = ..., accounting: _Optional[_Union[_common_pb2.GenerationAccounting, _Mapping]] = ..., filtered_groups: _Optional[int] = ..., filtered_samples: _Optional[int] = ..., filtered_tokens: _Optional[int] = ...) -> None: ...

class AckBatchRequest(_message.Message):
    __slots__ = ("step", "batch_id")
    STEP_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    step: int
    batch_id: str
    def __init__(self, step: _Optional[int] = ..., batch_id: _Optional[str] = ...) -> None: ...

class AckBatchResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class LedgerStatusRequest(_message.Message):
    __slots__ = ("versions_limit", "include_inactive_actors")
    VERSIONS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INACTIVE_ACTORS_FIELD_NUMBER: _ClassVar[int]
    versions_limit: int
    include_inactive_actors: bool
    def __init__(self, versions_limit: _Optional[int] = ..., include_inactive_actors: _Optional[bool] = ...) -> None: ...

class LeaseCounts(_message.Message):
    __slots__ = ("pending", "active", "settled", "rejected", "expired", "cancelled", "released")
    PENDING_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    pending: int
    active: int
    settled: int
    rejected: int
    expired: int
    cancelled: int
    released: int
    def __init__(self, pending: _Optional[int] = ..., active: _Optional[int] = ..., settled: _Optional[int] = ..., rejected: _Optional[int] = ..., expired: _Optional[int] = ..., cancelled: _Optional[int] = ..., released: _Optional[int] = ...) -> None: ...

class BufferStats(_message.Message):
    __slots__ = ("samples", "scored_samples", "ready_groups", "ready_samples", "capacity", "evicted_total", "oldest_version", "reserved_samples")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SCORED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    READY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    READY_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    EVICTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    OLDEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESERVED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    samples: int
    scored_samples: int
    ready_groups: int
    ready_samples: int
    capacity: int
    evicted_total: int
    oldest_version: int
    reserved_samples: int
    def __init__(self, samples: _Optional[int] = ..., scored_samples: _Optional[int] = ..., ready_groups: _Optional[int] = ..., ready_samples: _Optional[int] = ..., capacity: _Optional[int] = ..., evicted_total: _Optional[int] = ..., oldest_version: _Optional[int] = ..., reserved_samples: _Optional[int] = ...) -> None: ...

class SettlementStats(_message.Message):
    __slots__ = ("admitted", "duplicates", "rejected")
    class RejectedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    admitted: int
    duplicates: int
    rejected: _containers.ScalarMap[str, int]
    def __init__(self, admitted: _Optional[int] = ..., duplicates: _Optional[int] = ..., rejected: _Optional[_Mapping[str, int]] = ...) -> None: ...

class LedgerStatus(_message.Message):
    __slots__ = ("policy", "current_step", "current_version", "latest_version", "versions", "actors", "leases", "open_groups", "buffer", "settlement", "median_completion_time", "lease_ttl", "latest_command_sequence", "server_time", "accounting", "task_pools")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CURRENT_STEP_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    OPEN_GROUPS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    SETTLEMENT_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_COMPLETION_TIME_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_FIELD_NUMBER: _ClassVar[int]
    LATEST_COMMAND_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    TASK_POOLS_FIELD_NUMBER: _ClassVar[int]
    policy: JobPolicy
    current_step: int
    current_version: int
    latest_version: int
    versions: _containers.RepeatedCompositeFieldContainer[_common_pb2.PolicyVersion]
    actors: _containers.RepeatedCompositeFieldContainer[LedgerActor]
    leases: LeaseCounts
    open_groups: int
    buffer: BufferStats
    settlement: SettlementStats
    median_completion_time: _duration_pb2.Duration
    lease_ttl: _duration_pb2.Duration
    latest_command_sequence: int
    server_time: _timestamp_pb2.Timestamp
    accounting: _common_pb2.GenerationAccounting
    task_pools: _containers.RepeatedCompositeFieldContainer[TaskPoolStatus]
    def __init__(self, policy: _Optional[_Union[JobPolicy, _Mapping]] = ..., current_step: _Optional[int] = ..., current_version: _Optional[int] = ..., latest_version: _Optional[int] = ..., versions: _Optional[_Iterable[_Union[_common_pb2.PolicyVersion, _Mapping]]] = ..., actors: _Optional[_Iterable[_Union[LedgerActor, _Mapping]]] = ..., leases: _Optional[_Union[LeaseCounts, _Mapping]] = ..., open_groups: _Optional[int] = ..., buffer: _Optional[_Union[BufferStats, _Mapping]] = ..., settlement: _Optional[_Union[SettlementStats, _Mapping]] = ..., median_completion_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease_ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., latest_command_sequence: _Optional[int] = ..., server_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., accounting: _Optional[_Union[_common_pb2.GenerationAccounting, _Mapping]] = ..., task_pools: _Optional[_Iterable[_Union[TaskPoolStatus, _Mapping]]] = ...) -> None: ...

class TaskPoolStatus(_message.Message):
    __slots__ = ("task", "share", "pending_slots", "ready_groups", "inflight_samples")
    TASK_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    PENDING_SLOTS_FIELD_NUMBER: _ClassVar[int]
    READY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    task: str
    share: float
    pending_slots: int
    ready_groups: int
    inflight_samples: int
    def __init__(self, task: _Optional[str] = ..., share: _Optional[float] = ..., pending_slots: _Optional[int] = ..., ready_groups: _Optional[int] = ..., inflight_samples: _Optional[int] = ...) -> None: ...
