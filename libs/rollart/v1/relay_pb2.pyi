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

class RelaySubscriberKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RELAY_SUBSCRIBER_KIND_UNSPECIFIED: _ClassVar[RelaySubscriberKind]
    RELAY_SUBSCRIBER_KIND_ACTOR: _ClassVar[RelaySubscriberKind]
    RELAY_SUBSCRIBER_KIND_RELAY: _ClassVar[RelaySubscriberKind]

class DeliveryMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_MODE_UNSPECIFIED: _ClassVar[DeliveryMode]
    DELIVERY_MODE_PUSH: _ClassVar[DeliveryMode]
    DELIVERY_MODE_PULL: _ClassVar[DeliveryMode]

class UpstreamKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPSTREAM_KIND_UNSPECIFIED: _ClassVar[UpstreamKind]
    UPSTREAM_KIND_TRAINER: _ClassVar[UpstreamKind]
    UPSTREAM_KIND_RELAY: _ClassVar[UpstreamKind]
RELAY_SUBSCRIBER_KIND_UNSPECIFIED: RelaySubscriberKind
RELAY_SUBSCRIBER_KIND_ACTOR: RelaySubscriberKind
RELAY_SUBSCRIBER_KIND_RELAY: RelaySubscriberKind
DELIVERY_MODE_UNSPECIFIED: DeliveryMode
DELIVERY_MODE_PUSH: DeliveryMode
DELIVERY_MODE_PULL: DeliveryMode
UPSTREAM_KIND_UNSPECIFIED: UpstreamKind
UPSTREAM_KIND_TRAINER: UpstreamKind
UPSTREAM_KIND_RELAY: UpstreamKind

class RelaySubscribeRequest(_message.Message):
    __slots__ = ("subscriber_id", "kind", "region", "receive_endpoint", "streams", "control_endpoint", "has_active_version", "active_version", "staged_versions")
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    CONTROL_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    HAS_ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    STAGED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    subscriber_id: str
    kind: RelaySubscriberKind
    region: str
    receive_endpoint: str
    streams: int
    control_endpoint: str
    has_active_version: bool
    active_version: int
    staged_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, subscriber_id: _Optional[str] = ..., kind: _Optional[_Union[RelaySubscriberKind, str]] = ..., region: _Optional[str] = ..., receive_endpoint: _Optional[str] = ..., streams: _Optional[int] = ..., control_endpoint: _Optional[str] = ..., has_active_version: _Optional[bool] = ..., active_version: _Optional[int] = ..., staged_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class RelaySubscribeResponse(_message.Message):
    __slots__ = ("relay_id", "region", "data_endpoint", "streams", "mode", "session_token", "catch_up_versions", "needs_checkpoint", "ttl")
    RELAY_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    NEEDS_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    relay_id: str
    region: str
    data_endpoint: str
    streams: int
    mode: DeliveryMode
    session_token: str
    catch_up_versions: _containers.RepeatedScalarFieldContainer[int]
    needs_checkpoint: bool
    ttl: _duration_pb2.Duration
    def __init__(self, relay_id: _Optional[str] = ..., region: _Optional[str] = ..., data_endpoint: _Optional[str] = ..., streams: _Optional[int] = ..., mode: _Optional[_Union[DeliveryMode, str]] = ..., session_token: _Optional[str] = ..., catch_up_versions: _Optional[_Iterable[int]] = ..., needs_checkpoint: _Optional[bool] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RelayUnsubscribeRequest(_message.Message):
    __slots__ = ("subscriber_id",)
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    subscriber_id: str
    def __init__(self, subscriber_id: _Optional[str] = ...) -> None: ...

class WatchRelayEventsRequest(_message.Message):
    __slots__ = ("subscriber_id", "from_sequence", "only_new")
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ONLY_NEW_FIELD_NUMBER: _ClassVar[int]
    subscriber_id: str
    from_sequence: int
    only_new: bool
    def __init__(self, subscriber_id: _Optional[str] = ..., from_sequence: _Optional[int] = ..., only_new: _Optional[bool] = ...) -> None: ...

class VersionAvailable(_message.Message):
    __slots__ = ("delta",)
    DELTA_FIELD_NUMBER: _ClassVar[int]
    delta: CachedDelta
    def __init__(self, delta: _Optional[_Union[CachedDelta, _Mapping]] = ...) -> None: ...

class UpstreamChanged(_message.Message):
    __slots__ = ("upstream",)
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    upstream: RelayUpstreamStatus
    def __init__(self, upstream: _Optional[_Union[RelayUpstreamStatus, _Mapping]] = ...) -> None: ...

class RelayDraining(_message.Message):
    __slots__ = ("reason", "alternatives")
    REASON_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    reason: str
    alternatives: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, reason: _Optional[str] = ..., alternatives: _Optional[_Iterable[str]] = ...) -> None: ...

class RelayEvent(_message.Message):
    __slots__ = ("sequence", "at", "version", "commit", "upstream_changed", "draining")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_CHANGED_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    at: _timestamp_pb2.Timestamp
    version: VersionAvailable
    commit: _common_pb2.CommitOrder
    upstream_changed: UpstreamChanged
    draining: RelayDraining
    def __init__(self, sequence: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., version: _Optional[_Union[VersionAvailable, _Mapping]] = ..., commit: _Optional[_Union[_common_pb2.CommitOrder, _Mapping]] = ..., upstream_changed: _Optional[_Union[UpstreamChanged, _Mapping]] = ..., draining: _Optional[_Union[RelayDraining, _Mapping]] = ...) -> None: ...

class RelayUpstream(_message.Message):
    __slots__ = ("kind", "endpoint", "fallbacks", "streams")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    kind: UpstreamKind
    endpoint: str
    fallbacks: _containers.RepeatedScalarFieldContainer[str]
    streams: int
    def __init__(self, kind: _Optional[_Union[UpstreamKind, str]] = ..., endpoint: _Optional[str] = ..., fallbacks: _Optional[_Iterable[str]] = ..., streams: _Optional[int] = ...) -> None: ...

class SetUpstreamRequest(_message.Message):
    __slots__ = ("upstream",)
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    upstream: RelayUpstream
    def __init__(self, upstream: _Optional[_Union[RelayUpstream, _Mapping]] = ...) -> None: ...

class RelayUpstreamStatus(_message.Message):
    __slots__ = ("config", "active_endpoint", "connected", "receiving_version", "bytes_received", "last_segment_at", "failovers", "last_error")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    RECEIVING_VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEGMENT_AT_FIELD_NUMBER: _ClassVar[int]
    FAILOVERS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    config: RelayUpstream
    active_endpoint: str
    connected: bool
    receiving_version: int
    bytes_received: int
    last_segment_at: _timestamp_pb2.Timestamp
    failovers: int
    last_error: str
    def __init__(self, config: _Optional[_Union[RelayUpstream, _Mapping]] = ..., active_endpoint: _Optional[str] = ..., connected: _Optional[bool] = ..., receiving_version: _Optional[int] = ..., bytes_received: _Optional[int] = ..., last_segment_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., failovers: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class PushSegmentsResponse(_message.Message):
    __slots__ = ("versions", "accepted", "duplicates")
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[CachedDelta]
    accepted: int
    duplicates: int
    def __init__(self, versions: _Optional[_Iterable[_Union[CachedDelta, _Mapping]]] = ..., accepted: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class FetchDeltasRequest(_message.Message):
    __slots__ = ("from_version", "to_version", "subscriber_id", "only_sequences", "follow")
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    ONLY_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    from_version: int
    to_version: int
    subscriber_id: str
    only_sequences: _containers.RepeatedScalarFieldContainer[int]
    follow: bool
    def __init__(self, from_version: _Optional[int] = ..., to_version: _Optional[int] = ..., subscriber_id: _Optional[str] = ..., only_sequences: _Optional[_Iterable[int]] = ..., follow: _Optional[bool] = ...) -> None: ...

class RelayCommitRequest(_message.Message):
    __slots__ = ("order",)
    ORDER_FIELD_NUMBER: _ClassVar[int]
    order: _common_pb2.CommitOrder
    def __init__(self, order: _Optional[_Union[_common_pb2.CommitOrder, _Mapping]] = ...) -> None: ...

class RelayCommitResponse(_message.Message):
    __slots__ = ("delivered", "undelivered", "duplicate")
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    UNDELIVERED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    delivered: _containers.RepeatedScalarFieldContainer[str]
    undelivered: _containers.RepeatedScalarFieldContainer[str]
    duplicate: bool
    def __init__(self, delivered: _Optional[_Iterable[str]] = ..., undelivered: _Optional[_Iterable[str]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class CachedDelta(_message.Message):
    __slots__ = ("version", "base_version", "hash", "segments", "segments_total", "bytes", "complete", "verified", "source", "first_segment_at", "completed_at")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEGMENT_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    version: int
    base_version: int
    hash: bytes
    segments: int
    segments_total: int
    bytes: int
    complete: bool
    verified: bool
    source: str
    first_segment_at: _timestamp_pb2.Timestamp
    completed_at: _timestamp_pb2.Timestamp
    def __init__(self, version: _Optional[int] = ..., base_version: _Optional[int] = ..., hash: _Optional[bytes] = ..., segments: _Optional[int] = ..., segments_total: _Optional[int] = ..., bytes: _Optional[int] = ..., complete: _Optional[bool] = ..., verified: _Optional[bool] = ..., source: _Optional[str] = ..., first_segment_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RelaySubscriber(_message.Message):
    __slots__ = ("subscriber_id", "kind", "region", "mode", "endpoint", "connected", "watching", "active_version", "sent_version", "queued_segments", "bytes_sent", "committed_version", "subscribed_at", "last_seen")
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    WATCHING_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    QUEUED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    subscriber_id: str
    kind: RelaySubscriberKind
    region: str
    mode: DeliveryMode
    endpoint: str
    connected: bool
    watching: bool
    active_version: int
    sent_version: int
    queued_segments: int
    bytes_sent: int
    committed_version: int
    subscribed_at: _timestamp_pb2.Timestamp
    last_seen: _timestamp_pb2.Timestamp
    def __init__(self, subscriber_id: _Optional[str] = ..., kind: _Optional[_Union[RelaySubscriberKind, str]] = ..., region: _Optional[str] = ..., mode: _Optional[_Union[DeliveryMode, str]] = ..., endpoint: _Optional[str] = ..., connected: _Optional[bool] = ..., watching: _Optional[bool] = ..., active_version: _Optional[int] = ..., sent_version: _Optional[int] = ..., queued_segments: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., committed_version: _Optional[int] = ..., subscribed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_seen: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RelayStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RelayStatus(_message.Message):
    __slots__ = ("relay_id", "region", "data_endpoint", "upstream", "cached", "subscribers", "cache_bytes", "cache_capacity_bytes", "bytes_sent", "last_commit", "started_at")
    RELAY_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMIT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    relay_id: str
    region: str
    data_endpoint: str
    upstream: RelayUpstreamStatus
    cached: _containers.RepeatedCompositeFieldContainer[CachedDelta]
    subscribers: _containers.RepeatedCompositeFieldContainer[RelaySubscriber]
    cache_bytes: int
    cache_capacity_bytes: int
    bytes_sent: int
    last_commit: _common_pb2.CommitOrder
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, relay_id: _Optional[str] = ..., region: _Optional[str] = ..., data_endpoint: _Optional[str] = ..., upstream: _Optional[_Union[RelayUpstreamStatus, _Mapping]] = ..., cached: _Optional[_Iterable[_Union[CachedDelta, _Mapping]]] = ..., subscribers: _Optional[_Iterable[_Union[RelaySubscriber, _Mapping]]] = ..., cache_bytes: _Optional[int] = ..., cache_capacity_bytes: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., last_commit: _Optional[_Union[_common_pb2.CommitOrder, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PruneCacheRequest(_message.Message):
    __slots__ = ("keep_from_version", "keep_last")
    KEEP_FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    keep_from_version: int
    keep_last: int
    def __init__(self, keep_from_version: _Optional[int] = ..., keep_last: _Optional[int] = ...) -> None: ...

class PruneCacheResponse(_message.Message):
    __slots__ = ("evicted", "bytes_freed")
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    evicted: _containers.RepeatedScalarFieldContainer[int]
    bytes_freed: int
    def __init__(self, evicted: _Optional[_Iterable[int]] = ..., bytes_freed: _Optional[int] = ...) -> None: ...
