"""Actor configuration: the served model, the vLLM engine, where it registers, and its weight sources.

Every key can come from the YAML file (``--config``) or a ``ROLLART_<KEY>`` variable (``ROLLART_MODEL=/m``,
``ROLLART_HARDWARE__TAGS='[decode, avx512]'``); see ``rollart.runtime.config``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rollart.runtime import ids, ports
from rollart.runtime.config import StrictModel, WeightPlaneConfig, _check_address, receive_limit


class HardwareConfig(StrictModel):
    # Accelerator model ("cpu", "H800", ...); empty: detected (the CUDA device name, else "cpu").
    accelerator: str = ""
    # Accelerators (or CPU cores); 0: detected.
    count: int = Field(0, ge=0)
    # Accelerator (or host) memory in GiB; 0: detected.
    memory_gib: float = Field(0.0, ge=0)
    # Tags that affinity rules match on, e.g. "decode", "avx512", "region:us-east" (A-Za-z0-9._:/=+@#~-).
    # "kind:<pool_kind>" declares the hardware kind; it is added by itself when pool_kind is set.
    tags: list[str] = Field([], max_length=64)

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str]) -> list[str]:
        for i, tag in enumerate(value):
            if not re.fullmatch(r"[A-Za-z0-9._:/=+@#~-]{1,128}", tag):
                raise ValueError(f"tags[{i}] {tag!r}: 1-128 of A-Za-z0-9._:/=+@#~- (no spaces)")
            if tag.startswith("kind:") and tag[5:] not in ("cpu", "gpu-compute", "gpu-bandwidth", "serverless"):
                raise ValueError(f"tags[{i}] {tag!r}: unknown kind (cpu, gpu-compute, gpu-bandwidth, serverless)")
        return value


class WeightSourceConfig(StrictModel):
    # gRPC endpoint of the relay the delta subscriber follows (None: deltas are only pushed with StageDelta).
    relay_endpoint: str | None = None
    # Tried in order when the relay fails (peer relays, the trainer).
    fallback_endpoints: list[str] = []
    # Parallel TCP streams S asked from the relay.
    streams: int = Field(4, ge=1, le=64)
    # Checkpoint store (directory or s3:// URL) for full checkpoints (joiners, LoadCheckpoint by version).
    checkpoint_store: str | None = None

    @field_validator("relay_endpoint")
    @classmethod
    def _ep(cls, value: str | None) -> str | None:
        return None if value in (None, "") else _check_address(value)

    @field_validator("fallback_endpoints")
    @classmethod
    def _fbs(cls, value: list[str]) -> list[str]:
        return [_check_address(v) for v in value]


# The attention and MLP projections of Llama/Qwen-style decoders (the trainer's default target_modules).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class ActorLoraConfig(StrictModel):
    """A LoRA job's adapter settings (the job file's ``model.lora``): the actor serves base + adapter versions."""

    rank: int = Field(..., ge=1, le=256)
    alpha: float = Field(..., gt=0, le=1e6)
    # Training only (the actor accepts and ignores it).
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = Field(LORA_TARGETS, min_length=1, max_length=64)
    # Modules trained in full besides the adapter: not servable through vLLM's LoRA, so refused here.
    trainable_modules: list[str] = Field([], max_length=0)
    # The adapter tensor set of `weight_version` (peft names + rollart.base_hash; a file or folder of
    # .safetensors). None: until the first version arrives from weight_source.checkpoint_store the actor serves
    # the base, which is what version 0 (lora_B = 0) computes.
    adapter: str | None = None
    # h(v0) of the base's full weights, hex; None: computed from `model` at start.
    base_hash: str | None = None
    # Adapters the engine holds at once (the active version and those in-flight requests still use).
    max_loras: int = Field(3, ge=2, le=16)

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, value: list[str]) -> list[str]:
        for i, name in enumerate(value):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]{0,127}", name):
                raise ValueError(f"target_modules[{i}] {name!r}: a module name (A-Za-z0-9_.)")
        return value

    @field_validator("base_hash")
    @classmethod
    def _bh(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise ValueError("base_hash must be 64 hex digits")
        return value.lower()


class ActorConfig(WeightPlaneConfig):
    # Largest request accepted, in bytes (16 MiB):
    # StageDelta segments (<= max_segment_bytes) and Generate prompts of a long context.
    max_receive_message_bytes: int | None = receive_limit(16)
    require_job_key = False  # without a key the actor serves and only refuses weight updates
    listen: str = ports.listen("actor")

    # ---- model ----
    # Hugging Face checkpoint directory (or a model name the engine can load offline). The actor never builds
    # one: `rollart-devtools tiny-model --out DIR` does (and `rollart up` runs it when no model is given).
    model: str | None = None
    # Name reported to clients (default: the model path's last component).
    served_model_name: str | None = None
    # Version and h(v) of the weights in `model` (a trainer's version-0 export, or a later full checkpoint).
    weight_version: int = Field(0, ge=0)
    weight_hash: str | None = None
    # LoRA job: serve `model` as the base with the job's adapter versions (None: a full-weight job).
    lora: ActorLoraConfig | None = None

    # ---- identity and placement ----
    # Stable id (default: actor-<host>-<port> of the bound address).
    actor_id: str | None = None
    pool: str = "cpu"
    pool_kind: Literal["cpu", "gpu-compute", "gpu-bandwidth"] = "cpu"
    # Create the pool at the resource manager when it does not exist (an existing pool is never replaced).
    register_pool: bool = True
    region: str = "local"
    hardware: HardwareConfig = HardwareConfig()
    pd_role: Literal["unified", "prefill", "decode"] = "unified"
    # Heartbeat TTL at the resource manager.
    registration_ttl_seconds: float = Field(10.0, gt=0)
    # Job ledger address: register there and send ActorHeartbeat (weight state, tokens/s). None: no ledger.
    ledger: str | None = None
    ledger_heartbeat_seconds: float = Field(2.0, gt=0)
    # An attached job (AttachJob) whose ledger has not answered for this long is detached: its run was killed
    # without a DetachJob, and its adapters would hold an engine slot for good.
    attached_job_orphan_seconds: float = Field(120.0, gt=0)

    # ---- weights ----
    # job_id, job_key (WeightPlaneConfig): the job whose deltas this actor accepts, and its segment key.
    weight_source: WeightSourceConfig = WeightSourceConfig()
    # Mooncake master "host:port" for full-weight buckets (set by `rollart up` when it runs one).
    mooncake_master: str | None = None
    # Staged versions kept at most (older incomplete ones are dropped first).
    max_staged_versions: int = Field(8, ge=1)

    # ---- engine (vLLM) ----
    # GiB of KV cache on CPU (VLLM_CPU_KVCACHE_SPACE; whole GiB).
    kv_cache_gib: int = Field(1, ge=1)
    # Fraction of GPU memory for the engine (CUDA only).
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    # None: the model's own maximum.
    max_model_len: int | None = Field(None, ge=16)
    max_num_seqs: int = Field(64, ge=1)
    dtype: str = "auto"
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    # Chunked prefill; None: off on CPU, vLLM's default on GPUs. vllm-cpu 0.32 kills its engine when a request
    # with a seed is prefilled in parts ("CPU Generator does not use offset"), which happens whenever more
    # prompt tokens arrive at once than one step takes (e.g. re-prefills after a weight update). Off, every
    # prompt is prefilled in one step (the step budget grows to max_model_len).
    chunked_prefill: bool | None = None
    # "priority" honours ActorGenerateRequest.priority; "fcfs" rejects a non-zero priority.
    scheduling_policy: Literal["priority", "fcfs"] = "priority"
    # Which logprob a token carries: vLLM's raw model distribution or the processed (temperature,
    # penalties) one the token was sampled from.
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = "raw_logprobs"
    seed: int = 0
    # vLLM KV-transfer connector config for PD disaggregation (vLLM's KVTransferConfig as a mapping).
    kv_transfer_config: dict[str, Any] | None = None
    # Extra AsyncEngineArgs, passed as is (e.g. tensor_parallel_size on GPUs).
    engine_args: dict[str, Any] = {}
    # vLLM's files (IPC sockets, temporary files); None: a private temporary folder removed at exit.
    work_dir: Path | None = None
    # vLLM's model-inspection cache, reused across starts (a cold one costs ~9 s per start).
    vllm_cache_dir: Path | None = None

    # ---- generation ----
    # Window of the tokens/s figure (GetStatus, heartbeats).
    throughput_window_seconds: float = Field(10.0, gt=0)
    # Requests in flight at most (waiting at a pause included); more are refused with RESOURCE_EXHAUSTED.
    max_in_flight_requests: int = Field(4096, ge=1)

    @field_validator("ledger", "mooncake_master")
    @classmethod
    def _addr2(cls, value: str | None) -> str | None:
        return None if value in (None, "") else _check_address(value)

    @field_validator("pool")
    @classmethod
    def _pool(cls, value: str) -> str:
        why = ids.name_problem(value)
        if why:
            raise ValueError(f"pool {why}")
        return value

    @field_validator("actor_id")
    @classmethod
    def _aid(cls, value: str | None) -> str | None:
        why = None if value is None else ids.id_problem(value)
        if why:
            raise ValueError(f"actor_id {why}")
        return value

    @field_validator("weight_hash")
    @classmethod
    def _hash(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raise ValueError("weight_hash must be hex") from None
        if len(raw) != 32:
            raise ValueError("weight_hash must be 32 bytes (64 hex digits)")
        return value

    @model_validator(mode="after")
    def _needs_model(self) -> "ActorConfig":
        if not self.model:
            raise ValueError(
                "model is required (a checkpoint directory; `rollart-devtools tiny-model --out DIR` builds one)"
            )
        return self

    @model_validator(mode="after")
    def _kind_tag(self) -> "ActorConfig":
        declared = [t[5:] for t in self.hardware.tags if t.startswith("kind:")]
        if len(set(declared)) > 1 or (
            declared and "pool_kind" in self.model_fields_set and declared[0] != self.pool_kind
        ):
            raise ValueError(f"hardware.tags declare kind {declared} but pool_kind is {self.pool_kind!r}")
        return self

    def initial_hash(self) -> bytes | None:
        return bytes.fromhex(self.weight_hash) if self.weight_hash else None
