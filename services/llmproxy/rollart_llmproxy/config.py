"""LLMProxy configuration (YAML file + ROLLART_* environment, see rollart.runtime.config)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from rollart.runtime import ports
from rollart.runtime.config import ServiceConfig, StrictModel, _check_address, receive_limit


class StaticActor(StrictModel):
    """An actor routed to from the start (besides those the resource manager reports)."""

    actor_id: str
    endpoint: str
    pool: str = ""
    region: str = ""
    tags: list[str] = []
    pd_role: Literal["unified", "prefill", "decode"] = "unified"

    @field_validator("endpoint")
    @classmethod
    def _addr(cls, value: str) -> str:
        return _check_address(value)


class AffinityRuleConfig(StrictModel):
    """Task tag -> where its requests go (same fields as rollart.v1.AffinityRule)."""

    task: str
    pool: str = ""
    binding_id: str = ""
    pool_kind: Literal["", "gpu-compute", "gpu-bandwidth", "cpu", "serverless"] = ""
    hardware_tags: list[str] = []
    allow_fallback: bool = True
    # Route by the task's profile instead (prefill-heavy: gpu-compute, decode-heavy: gpu-bandwidth).
    auto: bool = False


class AutoAffinitySettings(StrictModel):
    """How `auto` affinity rules classify a task from its routed turns (see router.TaskProfile)."""

    # Prefill-heavy when a turn prefills at least this many times the tokens it decodes (moving averages).
    prefill_ratio: float = Field(2.0, gt=0)
    # A classified task changes profile only when the ratio crosses prefill_ratio by this factor.
    hysteresis: float = Field(1.5, ge=1)
    # Turns of a task seen before it is classified (until then its turns go to any actor).
    min_turns: int = Field(8, ge=1)
    # Requests in flight that make an actor saturated: an auto task whose kind's actors all are spills to a
    # compatible actor (0: only when none of its kind is usable).
    saturation_requests: int = Field(0, ge=0)


class PdPoolSettings(StrictModel):
    """Prefill/decode split of one pool (same fields as rollart.v1.PdPoolConfig)."""

    pool: str
    enabled: bool = True
    prefill_actor_ids: list[str] = []
    decode_actor_ids: list[str] = []
    kv_connector: str = ""
    kv_connector_config_json: str = ""
    min_prompt_tokens: int = Field(0, ge=0)


class LLMProxyConfig(ServiceConfig):
    # Largest request accepted, in bytes (16 MiB):
    # Generate and Tokenize carry a whole conversation.
    max_receive_message_bytes: int | None = receive_limit(16)
    listen: str = ports.listen("llmproxy")
    # OpenAI-compatible HTTP API ("host:port", port 0 picks one); None or "none" turns it off.
    http_listen: str | None = "127.0.0.1:0"
    # Ledger address: the proxy subscribes to its command stream as a ROUTER (step plans -> version window,
    # per-actor step allocations). None: the ledger the resource manager knows (role "ledger"), if any.
    ledger: str | None = None
    # Follow the ledger's step plans: admissible versions become [v - alpha, latest] (alpha 0 under STRICT).
    follow_ledger_window: bool = True
    # Subscriber id at the ledger (default: the instance name or "llmproxy").
    ledger_subscriber_id: str = ""
    # Role of the resource-manager workers that are actors.
    actor_role: str = "actor"
    # With a resource manager: register as role "llmproxy" in this pool (created as a CPU pool when missing).
    rm_pool: str = "gateway"
    rm_register_pool: bool = True
    # Actors configured up front.
    actors: list[StaticActor] = []
    # Affinity rules configured up front (SetAffinity replaces or merges them at run time).
    affinity: list[AffinityRuleConfig] = []
    # PD splits configured up front.
    pd: list[PdPoolSettings] = []
    # Task classification of `auto` affinity rules.
    auto_affinity: AutoAffinitySettings = AutoAffinitySettings()

    # How often each actor's GetStatus is polled (health, version, throughput), and its timeout.
    status_interval_seconds: float = Field(1.0, gt=0, le=60)
    status_timeout_seconds: float = Field(2.0, gt=0, le=60)
    # Consecutive failed status polls (other than a refused connection) that make an actor unhealthy.
    unhealthy_after_failures: int = Field(2, ge=1)
    # An actor whose status polls have gone unanswered (accepted, never answered: a stopped or wedged process)
    # for this long is hung: its in-flight turns are cut at once (UNAVAILABLE, retryable; a turn that streamed
    # nothing is routed to another actor) instead of waiting for it to wake. Detected within about
    # hung_after_seconds + status_timeout_seconds + status_interval_seconds of the hang.
    hung_after_seconds: float = Field(5.0, gt=0)
    # Deadline of a turn that names none (neither in the request nor on the call).
    default_deadline_seconds: float = Field(600.0, gt=0)
    # How long a request waits for a usable actor (none healthy/admissible right now) before UNAVAILABLE;
    # bounded by its deadline.
    route_wait_seconds: float = Field(5.0, ge=0)
    # Attempts per turn when an actor fails before it streamed anything (then UNAVAILABLE to the caller).
    max_route_attempts: int = Field(3, ge=1, le=10)
    # After Abort is forwarded, how long the actor may take to end the stream before the proxy cuts it.
    abort_grace_seconds: float = Field(2.0, gt=0)
    # Actor chunking for turns that name none (TrajectoryGenerateRequest.chunk_tokens): a chunk at least every
    # this many tokens (0: every token; larger chunks cost fewer messages per token, see bench/notes/llmproxy.md).
    chunk_tokens: int = Field(0, ge=0)
    # Sticky trajectory -> actor entries kept (least recently used evicted first).
    max_sticky_trajectories: int = Field(200_000, ge=1)
    # Requests that may wait for admission while suspended (more are refused with UNAVAILABLE).
    max_waiting_requests: int = Field(100_000, ge=1)
    # Full resync with the resource manager this often (besides its Watch stream).
    resync_interval_seconds: float = Field(30.0, gt=0)
    # Several LoRA jobs on one fleet (shares.py): turns the fleet runs at once at full speed (0: no shares), and
    # each job's weight (a job not named weighs 1; "" is the turns naming no job).
    fleet_turn_slots: int = Field(0, ge=0)
    job_shares: dict[str, float] = {}

    # Tokenizer used to count and tokenize messages locally (a model directory holding tokenizer.json and
    # tokenizer_config.json). None: the actors' Tokenize RPC is used when token ids are needed.
    tokenizer_dir: Path | None = None
    # OpenAI API: model name listed by /v1/models besides those the actors report (empty: none).
    served_model_name: str = ""
    # OpenAI API: task tag of requests without an X-Rollart-Task header.
    openai_task: str = ""
    # OpenAI API: max_tokens of chat requests that give none.
    openai_default_max_tokens: int = Field(512, ge=1)

    @field_validator("http_listen", "ledger")
    @classmethod
    def _opt_addr(cls, value: str | None) -> str | None:
        return None if value in (None, "", "none") else _check_address(value)

    @field_validator("job_shares")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        for job, w in value.items():
            if not (w > 0 and w < float("inf")):
                raise ValueError(f"job_shares[{job!r}] is {w}: a weight > 0")
        return value

    @field_validator("tokenizer_dir")
    @classmethod
    def _tok_dir(cls, value: Path | None) -> Path | None:
        if value is not None and not (value / "tokenizer.json").is_file():
            raise ValueError(f"no tokenizer.json in {value}")
        return value
