from __future__ import annotations

from pydantic import Field, field_validator

from rollart.runtime import ports
from rollart.runtime.config import JOB_ID_RE, ServiceConfig, receive_limit

JOB_RE = JOB_ID_RE  # the same job ids as the weight plane's


class LedgerConfig(ServiceConfig):
    # Largest request accepted, in bytes (16 MiB):
    # AddPrompts (up to 10,000 prompts) and Submit (one trajectory of a long context).
    max_receive_message_bytes: int | None = receive_limit(16)
    listen: str = ports.listen("ledger")
    # Pool the ledger registers in (role "ledger") when a resource manager is configured, so that envmanagers,
    # actors and the trainer can discover it; created as a CPU pool when missing.
    rm_pool: str = "control"
    # Redis holding the state (redis://host:port/db). Run it with AOF (appendfsync always) for durability.
    redis_url: str = "redis://127.0.0.1:6379/1"
    # Redis connections of this process; handlers beyond it wait for one (WatchCommands streams have their own).
    redis_max_connections: int = Field(64, ge=2, le=10_000)
    # Prefix of every key; one ledger (one job) per prefix.
    key_prefix: str = "rollart:ledger:"
    # Fixes the job id up front; SetJobPolicy must then name it. Empty: the first SetJobPolicy fixes it.
    job_id: str = ""
    # How often expired leases, silent actors and old records are swept.
    reap_interval_seconds: float = Field(0.1, gt=0, le=10)
    # An admitted sample submitted without its reward that has none this long after its admission (its scorer,
    # the envmanager, died or hung) is un-admitted by the reaper as a failed scoring and its slot re-pooled.
    # Default 2x the envmanager's reward_timeout_seconds (120 s), below the trainer's batch timeouts (300-600 s)
    # so a lost score cannot time out a step; raise it with the envmanager's reward timeout.
    score_deadline_seconds: float = Field(240.0, gt=0)
    # Final leases (and their verdicts), consumed groups and departed actors are kept this long for inspection
    # and idempotent replies, then purged.
    lease_retention_seconds: float = Field(3600.0, ge=0)
    actor_retention_seconds: float = Field(3600.0, ge=0)
    # Most commands kept for WatchCommands replay, on top of the policy's command_retention.
    command_history: int = Field(100_000, ge=100)
    # Window over which settled work is summed into one throughput observation of an actor (tau).
    tau_window_seconds: float = Field(5.0, gt=0)
    # Upper bound of any server-side wait (AcquireLeases, GetBatch, AwaitStepCommitted).
    max_wait_seconds: float = Field(600.0, gt=0)
    # Poll period of waiting calls (changes made in this process wake them at once).
    poll_interval_seconds: float = Field(0.1, gt=0, le=5)

    @field_validator("job_id")
    @classmethod
    def _job(cls, value: str) -> str:
        if value and not JOB_RE.match(value):
            raise ValueError(f"job_id must match {JOB_RE.pattern}")
        return value
