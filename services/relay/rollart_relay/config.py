from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rollart.runtime import ids, ports
from rollart.runtime.config import StrictModel, WeightPlaneConfig, _check_address, receive_limit


class UpstreamConfig(StrictModel):
    # trainer: the trainer pushes to this relay's data endpoint (nothing to dial). relay: follow another relay.
    kind: Literal["trainer", "relay"] = "trainer"
    # gRPC endpoint of the upstream relay (kind relay).
    endpoint: str | None = None
    # Tried in order when the upstream fails (peer relays, the trainer's gRPC endpoint).
    fallbacks: list[str] = []
    # Parallel TCP streams S asked from the upstream (0: the relay's `streams`).
    streams: int = Field(0, ge=0, le=64)

    @field_validator("endpoint")
    @classmethod
    def _ep(cls, value: str | None) -> str | None:
        return None if value is None else _check_address(value)

    @field_validator("fallbacks")
    @classmethod
    def _fbs(cls, value: list[str]) -> list[str]:
        return [_check_address(v) for v in value]

    @model_validator(mode="after")
    def _needs_endpoint(self) -> "UpstreamConfig":
        if self.kind == "relay" and not self.endpoint:
            raise ValueError("upstream.endpoint is required when upstream.kind is relay")
        return self


class RelayConfig(WeightPlaneConfig):
    # Largest request accepted, in bytes (16 MiB):
    # PushSegments carries delta segments of up to the trainer's max_segment_bytes (4 MiB by default).
    max_receive_message_bytes: int | None = receive_limit(16)
    listen: str = ports.listen("relay")
    # Striped-transport listener (segments in from the trainer, out to pull-mode subscribers); port 0 picks one.
    data_listen: str = "127.0.0.1:0"
    # Address announced to subscribers and in the ready file (default: the bound data_listen).
    data_advertise: str | None = None
    # job_id, job_key (WeightPlaneConfig): the job this relay serves and its segment key.
    relay_id: str | None = None
    region: str = "local"
    # Disk cache of complete deltas (catch-up, restarts). None: a private temporary directory.
    cache_dir: Path | None = None
    cache_capacity_bytes: int = Field(4 << 30, ge=1 << 20)
    cache_max_versions: int = Field(64, ge=1)
    # Complete deltas also kept in memory (older ones are read from disk).
    memory_versions: int = Field(2, ge=0)
    # Default parallel TCP streams S towards subscribers.
    streams: int = Field(4, ge=1, le=64)
    # cut_through: forward every segment the moment it arrives; store_and_forward: only complete deltas
    # (the benchmark's baseline).
    forward_mode: Literal["cut_through", "store_and_forward"] = "cut_through"
    upstream: UpstreamConfig = UpstreamConfig()
    # gRPC endpoints announced to subscribers when this relay drains (peers, the trainer).
    alternatives: list[str] = []
    subscriber_ttl_seconds: float = Field(30.0, gt=0)
    # A dropped stripe must be re-dialled within this long, and a transfer may stall at most idle_timeout.
    reconnect_timeout_seconds: float = Field(10.0, gt=0)
    idle_timeout_seconds: float = Field(60.0, gt=0)
    # How long a pull for a version not yet here waits for its first segment.
    pull_wait_seconds: float = Field(5.0, ge=0)

    @field_validator("data_listen")
    @classmethod
    def _data(cls, value: str) -> str:
        return _check_address(value)

    @field_validator("relay_id")
    @classmethod
    def _relay_id(cls, value: str | None) -> str | None:
        why = None if value is None else ids.id_problem(value)
        if why:
            raise ValueError(f"relay_id {why}")
        return value
