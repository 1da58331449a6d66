"""Configuration of ``rollart-trainer`` (YAML file plus ROLLART_* overrides, see rollart.runtime.config).

The job itself (model, mode, alpha, GRPO, publishing, prompts) arrives with ``StartJob``; this file holds what
belongs to the process: where it keeps its state, its identity on the weight plane (job id and segment key:
the relays and actors of the job use the same), and defaults for the peers a job spec leaves empty.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator

from rollart.runtime import ids, ports
from rollart.runtime.config import WeightPlaneConfig, _check_address


class TrainerConfig(WeightPlaneConfig):
    listen: str = ports.listen("trainer")
    # job_id (WeightPlaneConfig): the job this trainer publishes for; StartJob must name it.
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
    # Several LoRA jobs on one fleet: the job named on the LLMProxy's Suspend/Resume ("": turns naming no job).
    llmproxy_job_id: str = ""
    relays: list[str] = []
    # Relay gRPC endpoint -> the data endpoint to push deltas to, where the one a relay announces is not the way
    # to reach it (a region's link forwarder, docs/regions.md); a relay not named here is asked (GetStatus).
    relay_data_endpoints: dict[str, str] = {}
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

    @field_validator("ledger", "llmproxy", "mooncake_master", "data_listen", "data_advertise")
    @classmethod
    def _peer_addr(cls, value: str | None) -> str | None:
        return None if value in (None, "") else _check_address(value)

    @field_validator("llmproxy_job_id")
    @classmethod
    def _job(cls, value: str) -> str:
        return ids.optional_name("llmproxy_job_id", value)

    @field_validator("relays")
    @classmethod
    def _relays(cls, value: list[str]) -> list[str]:
        return [_check_address(v) for v in value]
