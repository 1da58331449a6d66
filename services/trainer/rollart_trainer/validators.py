"""StartJob's whole-spec check: every field of a ``TrainerJobSpec`` is validated before the job is accepted.

Invariant: a spec that passes :func:`check_spec` fails later only for reasons outside the spec (a peer down, a
model that does not load); a spec that can never run (unknown device or backend, a learning rate of inf, a 1 MB
model name, sizes out of range) is refused with INVALID_ARGUMENT naming the field (``spec.grpo.learning_rate``).
Every string that reaches the file system, a URL parser or a model loader (model, checkpoint store and uri,
dataset uris, metrics path) passes ``rollart.runtime.validation``'s path checks before anything touches it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from rollart.runtime import errors, ids
from rollart.runtime import validation as v
from rollart.v1 import common_pb2
from rollart.v1 import trainer_pb2 as T

DEVICE_RE = re.compile(r"^(cpu|mps|cuda(:[0-9]{1,2})?)$")
# A Hugging Face repository name ("org/name") or a bare name; anything else must be a local directory.
HF_NAME_RE = v.HF_NAME_RE
# HOST:PORT, or a gRPC target such as dns:///ledger:50052 or unix:/run/ledger.sock.
ADDRESS_RE = re.compile(r"^(?=.*:)[A-Za-z0-9._\-\[\]:/@%+~]{3,512}$")
DTYPES = ("", "float32", "bfloat16", "float16")
BACKENDS = (
    T.TRAINER_BACKEND_UNSPECIFIED,
    T.TRAINER_BACKEND_TORCH,
    T.TRAINER_BACKEND_FSDP2,
    T.TRAINER_BACKEND_MEGATRON,
)
MAX_PARALLEL = 1024
MAX_PATH_CHARS = v.MAX_PATH_CHARS
MAX_BATCH = 1_000_000  # the ledger's bounds
MAX_GROUP = 4096
MAX_ALPHA = 1000
MAX_TASKS = 64  # the ledger's bound on task shares
#: Relays and actors accept requests of 16 MiB: a segment must fit with room for the message around it.
MAX_SEGMENT_BYTES = 15 * 1024 * 1024
MAX_BATCH_TIMEOUT_S = 7 * 24 * 3600.0


def _address(field: str, value: str) -> None:
    if value and not ADDRESS_RE.match(value):
        raise errors.InvalidArgument(field, f"must be HOST:PORT or a gRPC target, got {errors.shorten(value)}")


def _exists(p: Path, *, directory: bool = False) -> bool:
    """Whether ``p`` is a file (a directory), False where the file system cannot tell (no permission)."""
    try:
        return p.is_dir() if directory else p.is_file()
    except OSError:
        return False


def _model(spec: T.TrainerJobSpec) -> None:
    model = v.text("spec.model", spec.model, MAX_PATH_CHARS, required=True)
    v.model("spec.model", model)  # before the file system sees it
    local = Path(model).expanduser()
    if model.startswith(("/", "./", "../", "~")) or _exists(local, directory=True):
        if not _exists(local / "config.json"):
            raise errors.InvalidArgument(
                "spec.model", f"{errors.shorten(model)} is not a checkpoint directory (no config.json)"
            )
    elif not HF_NAME_RE.match(model):
        raise errors.InvalidArgument(
            "spec.model", f"must be a checkpoint directory or a Hugging Face name, got {errors.shorten(model)}"
        )


def _grpo(g: T.GrpoConfig, spec: T.TrainerJobSpec) -> None:
    p = "spec.grpo."
    if g.learning_rate:
        v.number(p + "learning_rate", g.learning_rate, 0.0, 1.0, lo_open=True)
    v.number(p + "weight_decay", g.weight_decay, 0.0, 10.0)
    v.number(p + "clip_eps_low", g.clip_eps_low, 0.0, 1.0, hi_open=True)
    v.number(p + "clip_eps_high", g.clip_eps_high, 0.0, 100.0)
    v.number(p + "kl_coef", g.kl_coef, 0.0, 1e3)
    v.number(p + "max_grad_norm", g.max_grad_norm, 0.0, 1e9)
    v.integer(p + "micro_batch_size", g.micro_batch_size, 0, max(spec.batch_size, 0))
    v.integer(p + "epochs_per_batch", g.epochs_per_batch, 0, 100)
    v.integer(p + "max_seq_len", g.max_seq_len, 0, 1 << 22)
    _objective(g, spec)


def _objective(g: T.GrpoConfig, spec: T.TrainerJobSpec) -> None:
    """The training objective's fields (docs/objective.md): modes by name, caps and bounds in range, and
    the sampling the loss's behaviour logprobs assume."""
    from .grpo import objective_from_proto
    from .objective import ObjectiveError

    p = "spec.grpo."
    v.integer(p + "aggregation_length", g.aggregation_length, 0, 1 << 22)
    v.number(p + "entropy_coef", g.entropy_coef, 0.0, 1e3)
    v.integer(p + "overlong_buffer", g.overlong_buffer, 0, 1 << 22)
    v.integer(p + "overlong_max_tokens", g.overlong_max_tokens, 0, 1 << 22)
    v.number(p + "overlong_penalty", g.overlong_penalty, 0.0, 1e3)
    for name in ("is_cap", "mis_low", "mis_high"):
        if g.HasField(name):
            v.number(p + name, getattr(g, name), 0.0, 1e6)
    v.integer(p + "max_groups_per_batch", g.max_groups_per_batch, 0, MAX_BATCH)
    o = objective_from_proto(g)
    try:
        o.check(g.max_seq_len)
    except ObjectiveError as exc:
        raise errors.InvalidArgument(p + exc.field, exc.reason) from None
    groups = spec.batch_size // spec.group_size if spec.group_size >= 1 else 0
    if o.dynamic_sampling and spec.group_size < 2:
        # every group of one sample has zero variance: there would be nothing but filtering
        raise errors.InvalidArgument(
            p + "dynamic_sampling", f"needs groups of at least 2 samples (group_size is {spec.group_size})"
        )
    if o.dynamic_sampling and len(spec.tasks) > 1:
        # the prompt feed lays groups out by share, so it cannot replace the filtered groups of one task
        raise errors.InvalidArgument(
            p + "dynamic_sampling",
            "not available for multi-task jobs (spec.tasks): the prompt pool is topped up by share, not per task,"
            " so a task whose groups are filtered most would run out of prompts",
        )
    if o.dynamic_sampling and 0 < g.max_groups_per_batch < groups:
        # the ledger filters a group only while the bound leaves room for the whole batch: it would filter nothing
        raise errors.InvalidArgument(
            p + "max_groups_per_batch",
            f"must be 0 (4 x the batch's groups) or at least the batch's {groups} groups"
            f" (batch_size / group_size), got {g.max_groups_per_batch}",
        )
    if (
        not o.is_default_loss
        and spec.backend == T.TRAINER_BACKEND_MEGATRON
        and spec.parallel.pipeline_parallel_size > 1
    ):
        changed = [
            name
            for name, on in (
                ("correction", o.correction != "none"),
                ("loss_aggregation", o.loss_aggregation != "token-mean"),
                ("ratio_level", o.ratio_level != "token"),
                ("entropy_coef", o.entropy_coef != 0),
            )
            if on
        ]
        raise errors.InvalidArgument(
            p + changed[0],
            "the Megatron pipeline (pipeline_parallel_size > 1) computes the default loss only",
        )
    # vLLM's logprob of a token sampled under top-p / top-k truncation is not over the whole vocabulary
    # as the trainer's log-softmax is: every ratio and correction of the loss would be off (no mode here
    # computes the truncated distribution, so such a job is refused).
    s = spec.sampling
    if 0 < s.top_p < 1:
        raise errors.InvalidArgument(
            "spec.sampling.top_p",
            f"{s.top_p:g} truncates the distribution: training samples need top_p 1 (or 0), the loss's behaviour"
            " logprobs being over the whole vocabulary",
        )
    if s.top_k > 0:
        raise errors.InvalidArgument(
            "spec.sampling.top_k",
            f"{s.top_k} truncates the distribution: training samples need top_k 0 or -1, the loss's behaviour"
            " logprobs being over the whole vocabulary",
        )


def _publish(pub: T.PublishConfig) -> None:
    p = "spec.publish."
    v.enum(p + "weight_sync", pub.weight_sync, T.WeightSyncMode, required=False)
    v.integer(p + "checkpoint_every", pub.checkpoint_every, 0, 1_000_000)
    v.uri(p + "checkpoint_store", pub.checkpoint_store)
    v.items(p + "relay_endpoints", pub.relay_endpoints, 256)
    for i, endpoint in enumerate(pub.relay_endpoints):
        _address(f"{p}relay_endpoints[{i}]", endpoint)
    v.integer(p + "streams", pub.streams, 0, 64)
    _address(p + "mooncake_master", pub.mooncake_master)
    v.integer(p + "bucket_bytes", pub.bucket_bytes, 0, 64 << 30)
    if pub.dtype not in DTYPES:
        choices = ", ".join(DTYPES[1:])
        raise errors.InvalidArgument(p + "dtype", f"must be one of {choices}, got {errors.shorten(pub.dtype)}")
    if pub.max_segment_bytes:
        v.integer(p + "max_segment_bytes", pub.max_segment_bytes, 4096, MAX_SEGMENT_BYTES)


def megatron_available() -> bool:
    """megatron-core importable (the trainer's ``megatron`` extra), found without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        return False


def _parallel(spec: T.TrainerJobSpec) -> None:
    """The model-parallel layout: only the Megatron backend splits a model, and only in ways the model allows."""
    p = "spec.parallel."
    tp = v.integer(p + "tensor_parallel_size", spec.parallel.tensor_parallel_size, 0, MAX_PARALLEL) or 1
    pp = v.integer(p + "pipeline_parallel_size", spec.parallel.pipeline_parallel_size, 0, MAX_PARALLEL) or 1
    if spec.backend != T.TRAINER_BACKEND_MEGATRON:
        if tp > 1 or pp > 1:
            which = "tensor_parallel_size" if tp > 1 else "pipeline_parallel_size"
            raise errors.InvalidArgument(p + which, "model parallelism needs backend megatron")
        return
    if not megatron_available():
        raise errors.InvalidArgument(
            "spec.backend", "megatron-core is not installed (pip install 'rollart-trainer[megatron]')"
        )
    from .megatron.convert import Qwen3Layout, UnsupportedModel

    config = Path(spec.model).expanduser() / "config.json"
    if not _exists(config):
        raise errors.InvalidArgument("spec.model", "the Megatron backend needs a local checkpoint directory")
    try:
        layout = Qwen3Layout.from_hf_config(json.loads(config.read_text()))
    except (UnsupportedModel, ValueError, TypeError, KeyError) as exc:
        raise errors.InvalidArgument("spec.model", f"not convertible to Megatron: {errors.shorten(str(exc))}") from None
    for which, why in layout.parallel_errors(tp, pp):
        raise errors.InvalidArgument(p + which, why)
    # The trainer starts tp x pp ranks itself (rollart_trainer.ranks), one CPU core or one GPU each.
    world, (have, what) = tp * pp, _rank_capacity(spec.device)
    if world > have:
        raise errors.InvalidArgument(
            p + ("pipeline_parallel_size" if pp > 1 else "tensor_parallel_size"),
            f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} = {world} ranks, more than the {have} {what}"
            " this trainer has (one rank each)",
        )


def _rank_capacity(device: str) -> tuple[int, str]:
    """(how many ranks this host can run, of what): GPUs when the job runs on CUDA, else usable CPU cores."""
    import os

    if not device or device == "auto" or device.startswith("cuda"):
        try:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.device_count(), "GPUs"
        except ImportError:
            pass
    try:
        return len(os.sched_getaffinity(0)), "CPU cores"
    except AttributeError:
        return os.cpu_count() or 1, "CPU cores"


def _sampling(s: common_pb2.SamplingParams) -> None:
    p = "spec.sampling."
    v.number(p + "temperature", s.temperature, 0.0, 100.0)
    v.number(p + "top_p", s.top_p, 0.0, 1.0)
    v.integer(p + "top_k", s.top_k, -1, 1_000_000)
    v.integer(p + "max_tokens", s.max_tokens, 0, 1 << 20)
    v.items(p + "stop", s.stop, 64)
    for i, stop in enumerate(s.stop):
        v.text(f"{p}stop[{i}]", stop, 256)
    v.items(p + "stop_token_ids", s.stop_token_ids, 1024)
    v.number(p + "repetition_penalty", s.repetition_penalty, 0.0, 100.0)


def _prompts(where: str, pr: T.PromptSource) -> None:
    v.text(f"{where}.task", pr.task, 256)
    ids.check_id(f"{where}.environment", pr.environment, required=False)
    v.uri(f"{where}.dataset_uri", pr.dataset_uri)
    if pr.dataset_uri and not pr.dataset_uri.startswith(("s3://", "http://", "https://")):
        if not _exists(Path(pr.dataset_uri.removeprefix("file://"))):
            raise errors.InvalidArgument(f"{where}.dataset_uri", f"no such file: {errors.shorten(pr.dataset_uri)}")
    v.mapping(f"{where}.metadata", pr.metadata, 256, max_value_chars=1 << 20)


def _tasks(spec: T.TrainerJobSpec) -> None:
    """Multi-task jobs: distinct task tags, finite shares >= 0 summing to a positive number, and every task
    with at least one group of a step's batch (a task with none would never be trained)."""
    if len(spec.tasks) > MAX_TASKS:
        raise errors.InvalidArgument("spec.tasks", f"at most {MAX_TASKS} tasks, got {len(spec.tasks)}")
    seen: set[str] = set()
    for i, src in enumerate(spec.tasks):
        where = f"spec.tasks[{i}]"
        _prompts(where, src)
        tag = src.task or src.environment
        if not tag:
            raise errors.InvalidArgument(f"{where}.task", "a task needs a tag (task or environment)")
        if any(c.isspace() for c in tag) or len(tag) > 128:
            raise errors.InvalidArgument(
                f"{where}.task", f"must be 1-128 non-blank characters, got {errors.shorten(tag)}"
            )
        if tag in seen:
            raise errors.InvalidArgument(f"{where}.task", f"task {tag!r} is listed twice")
        seen.add(tag)
        if not math.isfinite(src.share) or src.share < 0:
            raise errors.InvalidArgument(f"{where}.share", f"must be finite and >= 0 (0: uniform), got {src.share}")
    if not len(spec.tasks):
        return
    from .tasks import quotas, shares, sources

    if spec.batch_size >= 1 and spec.group_size >= 1:
        groups = max(spec.batch_size // spec.group_size, 1)
        for i, (task, n) in enumerate(quotas(groups, shares(sources(spec))).items()):
            if n == 0:
                raise errors.InvalidArgument(
                    f"spec.tasks[{i}].share", f"task {task!r} gets no group of a batch of {groups} groups"
                )


def check_spec(spec: T.TrainerJobSpec) -> None:
    """Raise ``errors.InvalidArgument`` for the first field of ``spec`` that can never work."""
    ids.check_name("spec.job_id", spec.job_id)
    _model(spec)
    v.enum("spec.backend", spec.backend, T.TrainerBackend, required=False, allowed=BACKENDS)
    v.enum("spec.mode", spec.mode, T.StepMode, required=False)
    v.integer("spec.alpha", spec.alpha, 0, MAX_ALPHA)
    v.enum("spec.admission", spec.admission, common_pb2.AdmissionPolicy, required=False)
    v.integer("spec.batch_size", spec.batch_size, 1, MAX_BATCH)
    v.integer("spec.group_size", spec.group_size, 1, MAX_GROUP)
    v.integer("spec.redundancy", spec.redundancy, 0, MAX_GROUP)
    v.integer("spec.max_steps", spec.max_steps, 0, 1 << 40)
    _grpo(spec.grpo, spec)
    _publish(spec.publish)
    c = spec.checkpoint
    v.uri("spec.checkpoint.uri", c.uri)
    v.integer("spec.checkpoint.every_steps", c.every_steps, 0, 1_000_000)
    v.integer("spec.checkpoint.keep_last", c.keep_last, 0, 1_000_000)
    _prompts("spec.prompts", spec.prompts)
    _tasks(spec)
    for name in ("ledger", "llmproxy", "resource_manager"):
        _address(f"spec.endpoints.{name}", getattr(spec.endpoints, name))
    _sampling(spec.sampling)
    device = spec.device
    if device and not DEVICE_RE.match(device):
        raise errors.InvalidArgument("spec.device", f"must be cpu, cuda, cuda:N or mps, got {errors.shorten(device)}")
    v.duration("spec.batch_timeout", spec.batch_timeout, max_seconds=MAX_BATCH_TIMEOUT_S)
    if spec.HasField("batch_timeout") and v.duration("spec.batch_timeout", spec.batch_timeout) <= 0:
        raise errors.InvalidArgument("spec.batch_timeout", "must be > 0")
    v.path("spec.metrics_path", spec.metrics_path)
    v.mapping("spec.options", spec.options, 256)
    _parallel(spec)
    from .lora import check_lora

    check_lora(spec)  # spec.lora (LoRA jobs): rank, alpha, dropout, module names against the model, backend
    # The GRPO settings as the backend will build them (options such as grpo.temperature included).
    from .grpo import GrpoSettings

    try:
        GrpoSettings.from_job_spec(spec)
    except ValueError as exc:
        raise errors.InvalidArgument("spec.grpo", str(exc)) from None


def check_list_published(request: T.ListPublishedVersionsRequest) -> None:
    if request.limit < 0 or request.from_version < 0:
        raise errors.InvalidArgument("from_version", "from_version and limit must be >= 0")


def check_step_metrics(request: T.GetStepMetricsRequest) -> None:
    if request.from_step < 0 or request.to_step < 0:
        raise errors.InvalidArgument("from_step", "from_step and to_step must be >= 0")
