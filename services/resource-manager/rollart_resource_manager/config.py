from __future__ import annotations

from pydantic import Field

from rollart.runtime import ports
from rollart.runtime.config import ServiceConfig, receive_limit


class ResourceManagerConfig(ServiceConfig):
    # Largest request accepted, in bytes (1 MiB):
    # pools, workers and bindings are small records.
    max_receive_message_bytes: int | None = receive_limit(1)
    listen: str = ports.listen("resource-manager")
    # Redis holding the state (redis://host:port/db or unix:///path?db=0).
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Prefix of every key, so several jobs can share one Redis.
    key_prefix: str = "rollart:rm:"
    # Heartbeat TTL given to workers that do not ask for one.
    default_ttl_seconds: float = Field(10.0, gt=0)
    # How often expired workers are swept and bindings re-placed.
    reap_interval_seconds: float = Field(0.5, gt=0)
    # How long expired workers stay listable (include_expired) before they are purged.
    expired_retention_seconds: float = Field(300.0, ge=0)
    # Events kept for Watch resumption.
    event_history: int = Field(10_000, ge=100)
