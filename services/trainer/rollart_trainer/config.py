"""Configuration of ``rollart-trainer`` (YAML file plus ROLLART_* overrides, see rollart.runtime.config).

The job itself (model, mode, alpha, GRPO, publishing, prompts) arrives with ``StartJob``; this file holds what
belongs to the process: where it keeps its state, its identity on the weight plane (job id and segment key:
the relays and actors of the job use the same), and defaults for the peers a job spec leaves empty.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from rollart.runtime.config import ServiceConfig, _check_address

JOB_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


class TrainerConfig(ServiceConfig):
    listen: str = "127.0.0.1:50054"
    # The job this trainer publishes for (segment headers, transport handshakes); StartJob must name it.
    job_id: str = "default"
    # The job's segment key (HMAC of every delta segment); never the bearer token.
    job_key: SecretStr | None = None
    job_key_file: Path | None = None
    # Where the running job's spec (for resuming after a restart), default checkpoints and the publisher's
    # delta cache live (default: trainer/ in the local cluster's state directory).
    work_dir: Path = Field(default_factory=lambda: Path(os.environ.get("ROLLART_STATE_DIR", ".rollart")) / "trainer")
    # Resume the job found in work_dir at start (a trainer killed mid-job continues on its own).
    resume: bool = True
    # Striped-transport listener of the publisher (actors fall back to the trainer when their relay dies).
    data_listen: str = "127.0.0.1:0"
    # Address announced for it (default: the bound one; set it when that is not reachable, e.g. 0.0.0.0).
    data_advertise: str | None = None
    # Intra-op threads of torch: on a shared CPU host one thread is several times faster than many threads
    # spin-waiting for descheduled peers.
    torch_threads: int = Field(1, ge=1, le=256)
    # Peers used when the job spec leaves them empty.
    ledger: str | None = None
    llmproxy: str | None = None
    relays: list[str] = []
    mooncake_master: str | None = None
    # Bounds of the protocol's waits (a job spec's batch_timeout overrides get_batch's).
    batch_timeout_seconds: float = Field(600.0, gt=0)
    # How long the update phase waits for the actors to have the new version staged, then committed.
    stage_wait_seconds: float = Field(10.0, ge=0)
    commit_wait_seconds: float = Field(60.0, gt=0)
    # Once one actor applied the version, how long the others get before the step goes on without them.
    commit_grace_seconds: float = Field(5.0, ge=0)
    # ONE_OFF mode: how long the update waits for in-flight requests to finish (no preemption).
    drain_wait_seconds: float = Field(120.0, gt=0)
    # Deadline of every other call to a peer.
    rpc_timeout_seconds: float = Field(30.0, gt=0)
    # Events and step metrics kept in memory for WatchJob replay.
    history: int = Field(10_000, ge=10)

    @field_validator("job_id")
    @classmethod
    def _job(cls, value: str) -> str:
        if not JOB_RE.match(value):
            raise ValueError(f"job_id must match {JOB_RE.pattern}")
        return value

    @field_validator("ledger", "llmproxy", "mooncake_master", "data_listen", "data_advertise")
    @classmethod
    def _peer_addr(cls, value: str | None) -> str | None:
        return None if value in (None, "") else _check_address(value)

    @field_validator("relays")
    @classmethod
    def _relays(cls, value: list[str]) -> list[str]:
        return [_check_address(v) for v in value]

    @field_validator("job_key_file")
    @classmethod
    def _key_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file does not exist: {value}")
        return value

    @model_validator(mode="after")
    def _key(self) -> "TrainerConfig":
        if self.key() is None:
            raise ValueError("job_key is required (set job_key, job_key_file, ROLLART_JOB_KEY or ROLLART_JOB_KEY_FILE)")
        return self

    def key(self) -> bytes | None:
        """The segment key as raw bytes (a key file's surrounding whitespace removed, as relays and actors do)."""
        if self.job_key is not None:
            return self.job_key.get_secret_value().encode("utf-8") or None
        if self.job_key_file is not None:
            return self.job_key_file.read_bytes().strip() or None
        return None
