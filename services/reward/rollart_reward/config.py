from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rollart.runtime import ports
from rollart.runtime.config import ServiceConfig, StrictModel, receive_limit

KIND_NAMES = ("math", "reasoning_gym", "code", "game", "llm_judge", "custom")
DEFAULT_TIMEOUTS = {"math": 10.0, "reasoning_gym": 10.0, "code": 30.0, "game": 5.0, "llm_judge": 60.0, "custom": 30.0}


class SandboxSettings(StrictModel):
    """Limits of the bwrap sandbox that code tests run in."""

    bwrap: str = "bwrap"
    # Address-space limit (RLIMIT_AS) in MiB.
    memory_mb: int = Field(1024, ge=64, le=65536)
    # CPU-seconds limit; None: the scoring's time budget rounded up, plus one.
    cpu_seconds: float | None = Field(None, gt=0)
    file_size_mb: int = Field(16, ge=1)
    # Processes and threads (RLIMIT_NPROC, counted per sandbox: each run gets its own uid).
    max_processes: int = Field(64, ge=4, le=4096)
    open_files: int = Field(256, ge=16)
    uid_base: int = Field(200_000, ge=1000)
    uid_span: int = Field(100_000, ge=1)
    # Where workspaces are created (None: the system's temporary directory).
    workdir: Path | None = None
    output_tail_bytes: int = Field(4000, ge=0)


class PoolConfig(StrictModel):
    """The elastic worker pool."""

    min_workers: int = Field(0, ge=0)
    max_workers: int = Field(default_factory=lambda: max(1, os.cpu_count() or 1), ge=1, le=1024)
    idle_timeout_seconds: float = Field(30.0, gt=0)
    start_timeout_seconds: float = Field(60.0, gt=0)
    # Times a job is retried on a fresh worker when its worker dies mid-scoring.
    crash_retries: int = Field(1, ge=0, le=5)
    kill_grace_seconds: float = Field(0.5, ge=0)
    # Libraries a worker imports before it says ready (its first scoring is then not slowed by imports).
    preload: list[Literal["math", "reasoning_gym", "code"]] = ["math"]

    @model_validator(mode="after")
    def _bounds(self) -> "PoolConfig":
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) must be <= max_workers ({self.max_workers})")
        return self


class RewardConfig(ServiceConfig):
    # Largest request accepted, in bytes (16 MiB):
    # Score carries a whole trajectory (tokens, log-probabilities, text).
    max_receive_message_bytes: int | None = receive_limit(16)
    listen: str = ports.listen("reward")
    pool: PoolConfig = PoolConfig()
    sandbox: SandboxSettings = SandboxSettings()
    # Default time budget per scorer kind, in seconds (a request's timeout overrides it; kinds left out keep
    # DEFAULT_TIMEOUTS).
    timeouts: dict[str, float] = dict(DEFAULT_TIMEOUTS)
    # Largest time budget a request may ask for.
    max_timeout_seconds: float = Field(600.0, gt=0)
    # Entries of the in-process idempotency cache (LRU).
    cache_size: int = Field(100_000, ge=1)
    # Optional Redis for the idempotency cache (shared by replicas, survives restarts).
    redis_url: str | None = None
    redis_key_prefix: str = "rollart:reward:"
    redis_ttl_seconds: float = Field(86_400.0, gt=0)
    # The LLMProxy the judge calls (None: discovered through the resource manager, role "llmproxy").
    llmproxy: str | None = None
    judge_route: str = "judge"
    judge_max_tokens: int = Field(512, gt=0)
    # User scorers: name -> "package.module:function" (SCORER_KIND_CUSTOM with RewardSpec.scorer = name).
    custom_scorers: dict[str, str] = {}
    # Requests of one ScoreMany stream being scored at once (more wait in the stream: backpressure).
    stream_window: int = Field(256, ge=1)
    # With a resource manager: register as role "reward" in this pool (created as a SERVERLESS pool).
    rm_pool: str = "reward"
    rm_register_pool: bool = True

    @field_validator("timeouts")
    @classmethod
    def _kinds(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = set(value) - set(KIND_NAMES)
        if unknown:
            raise ValueError(f"unknown scorer kinds {sorted(unknown)}; known: {list(KIND_NAMES)}")
        bad = {k: v for k, v in value.items() if not v > 0}
        if bad:
            raise ValueError(f"timeouts must be > 0, got {bad}")
        return value

    @field_validator("custom_scorers")
    @classmethod
    def _targets(cls, value: dict[str, str]) -> dict[str, str]:
        for name, target in value.items():
            module, _, attr = target.partition(":")
            if not name or not module or not attr:
                raise ValueError(f"custom scorer {name!r} must map to 'package.module:function', got {target!r}")
        return value

    def timeout_for(self, kind: str) -> float:
        return min(self.timeouts.get(kind, DEFAULT_TIMEOUTS.get(kind, 30.0)), self.max_timeout_seconds)
