"""Configuration of ``rollart-envmanager`` (YAML file plus ROLLART_* overrides, see rollart.runtime.config)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from rollart.runtime import ids, ports
from rollart.runtime.config import ServiceConfig, StrictModel, receive_limit


class SandboxDefaults(StrictModel):
    """Default limits of every sandbox (a loop group's SandboxSpec overrides the fields it sets)."""

    time_budget_s: float = Field(600.0, gt=0)
    step_timeout_s: float = Field(60.0, gt=0)
    memory_mib: int = Field(1024, gt=0)
    cpu_limit: float = Field(1.0, gt=0)
    pids_limit: int = Field(64, gt=0)
    workspace_mib: int = Field(256, gt=0)
    file_size_mib: int = Field(64, gt=0)
    open_files: int = Field(256, gt=0)


class EnvManagerConfig(ServiceConfig):
    # Largest request accepted, in bytes (8 MiB):
    # RunEpisode carries a prompt and its metadata.
    max_receive_message_bytes: int | None = receive_limit(8)
    listen: str = ports.listen("envmanager")
    # Id of this envmanager: the lease holder prefix of its loops and its WatchCommands subscriber id
    # (default: envmanager-<host>-<pid>). Kept stable across restarts (as `rollart up` does), a restarted process
    # releases at start the leases its predecessor left under the same holders (their samples return at once
    # instead of at expiry); never give two running envmanagers the same id.
    manager_id: str = ""
    # Region of this host (lease assignment prefers actors nearby).
    region: str = ""
    # Peers; None: discovered through the resource manager (roles "ledger", "llmproxy", "reward").
    ledger: str | None = None
    llmproxy: str | None = None
    reward: str | None = None
    # Several LoRA jobs on one fleet: the job its turns name to the LLMProxy (its adapter; "": actors' own job).
    llmproxy_job_id: str = ""
    # Most loops this process hosts at once (over all groups).
    max_loops: int = Field(4096, ge=1)
    # Threads that run blocking environment and sandbox calls (reset, step, close, sandbox start).
    env_threads: int = Field(256, ge=1)
    # How long one AcquireLeases call waits on the ledger when no lease is available.
    lease_wait_seconds: float = Field(2.0, gt=0, le=60)
    # A lease is renewed when this fraction of its time-to-live has passed.
    renew_fraction: float = Field(0.33, gt=0, lt=1)
    # Generation: retries of a turn whose actor was lost (the proxy's retryable UNAVAILABLE), the backoff
    # before each, the default time budget of one turn and the default max_tokens when a spec sets none.
    generation_retries: int = Field(3, ge=0, le=20)
    generation_retry_backoff_seconds: float = Field(0.2, ge=0)
    generation_timeout_seconds: float = Field(300.0, gt=0)
    default_max_tokens: int = Field(512, gt=0)
    # Reward: budget of one Score call, and retries of retryable failures before the ledger is told that
    # scoring failed (RecordReward failed=true: the sample is re-issued, never recorded as a zero reward).
    reward_timeout_seconds: float = Field(120.0, gt=0)
    reward_retries: int = Field(2, ge=0, le=10)
    # Settlement: Submit (idempotent) is retried with backoff while the ledger is unreachable, for at least
    # this long (and while the lease is valid); after that the trajectory is an infrastructure failure
    # ("ledger-unavailable") and its lease is released, that release retried for up to release_retry_seconds
    # (unreleased, the lease expires back to the pool by itself).
    settle_retry_seconds: float = Field(30.0, ge=0)
    release_retry_seconds: float = Field(60.0, ge=0)
    # Deadline of every other call to a peer.
    rpc_timeout_seconds: float = Field(10.0, gt=0)
    # Backoff of a loop after an error it cannot attribute to one trajectory (ledger unreachable, ...).
    backoff_seconds: float = Field(0.5, gt=0)
    max_backoff_seconds: float = Field(10.0, gt=0)
    # Keep a healthy hosted environment (its child process) for the loop's next trajectory instead of
    # closing it; False creates a fresh environment and sandbox per trajectory.
    reuse_environments: bool = False
    sandbox: SandboxDefaults = SandboxDefaults()
    # User environments registered at start: [{"id", "factory": "module:callable", ...EnvInfo fields}].
    environments: list[dict[str, Any]] = []
    # With a resource manager: register as role "envmanager" in this pool (created as a CPU pool).
    rm_pool: str = "cpu"
    rm_register_pool: bool = True

    @field_validator("manager_id")
    @classmethod
    def _manager_id(cls, value: str) -> str:
        why = ids.id_problem(value) if value else None
        if why:
            raise ValueError(f"manager_id {why}")
        return value

    @field_validator("llmproxy_job_id")
    @classmethod
    def _job(cls, value: str) -> str:
        return ids.optional_name("llmproxy_job_id", value)

    @field_validator("ledger", "llmproxy", "reward")
    @classmethod
    def _peer(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected HOST:PORT, got {value!r}")
        return value
