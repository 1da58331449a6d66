"""Job files: YAML (or dicts) to the protobuf messages of a job, and the digest of initial weights.

A job file (``examples/*.yaml``) has these top-level sections:

- ``job``: a ``rollart.v1.TrainerJobSpec`` in proto field names. Enum values may be written short and in any
  case (``mode: async`` for ``STEP_MODE_ASYNC``, ``admission: bounded``, ``weight_sync: delta``, ``kind: game``),
  durations as ``"300s"`` or a number of seconds, map values as any scalar.
- ``environment``: the ``rollart.v1.EnvironmentSpec`` the envmanager loops run; ``loops``: how many.
- ``tasks`` (multi-task jobs, instead of ``environment`` and ``job.prompts``): a list of tasks trained together
  by one policy, each with its ``name`` (the task tag), ``environment`` (an EnvironmentSpec), ``prompts`` (a
  PromptSource: seed, dataset, metadata), ``share`` of every batch (default 1: uniform), ``loops``, ``reward``
  (a RewardSpec), ``envmanager`` (the instance that serves it: ``envmanager``, ``envmanager-2``, ...) and
  ``affinity`` (``auto`` or an AffinityRule's fields: ``pool``, ``pool_kind``, ``hardware_tags``,
  ``allow_fallback``). See :func:`job_tasks`.
- ``model``: how ``rollart run`` prepares the model when ``job.model`` is ``tiny`` (see rollart.job.run), and
  ``model.lora`` (LoRA training: rank, alpha, dropout, target_modules, trainable_modules), copied into
  ``job.lora`` when the file is loaded (:func:`sync_lora`).
- ``cluster`` and ``run``: processes and output of ``rollart run``.
- ``eval``: validation during training on held-out prompts, checked at load to be disjoint from the training's
  (rollart.job.evaluation).
- ``tracking``: TensorBoard, W&B and MLflow runs and rollout samples of ``rollart run`` (rollart.job.tracking).

Only ``job`` matters to the trainer; everything here is torch-free (the CLI and tests import it).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from rollart.delta.identity import weights_digest  # h(v0): weights no delta produced (re-exported)
from rollart.v1 import common_pb2, envmanager_pb2, llmproxy_pb2, trainer_pb2


class SpecError(ValueError):
    """A job file or spec that cannot be used (the message names the key)."""


def _enum_prefix(enum: EnumDescriptor) -> str:
    # StepMode -> STEP_MODE_, WeightSyncMode -> WEIGHT_SYNC_MODE_ (the proto style guide's value prefix).
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"


def _enum_value(field: FieldDescriptor, raw: Any, where: str) -> Any:
    enum = field.enum_type
    if enum is None:
        raise TypeError(f"{field.full_name} is not an enum field")
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise SpecError(f"{where}: expected a name of {enum.name}, got {raw!r}")
    if isinstance(raw, int):
        return raw
    prefix = _enum_prefix(enum)
    name = raw.strip().upper().replace("-", "_")
    for candidate in (name, prefix + name):
        if candidate in enum.values_by_name:
            return candidate
    known = [v.name.removeprefix(prefix).lower() for v in enum.values if v.number]
    raise SpecError(f"{where}: unknown {enum.name} {raw!r} (one of {', '.join(known)})")


def _duration(raw: Any, where: str) -> str:
    if isinstance(raw, bool):
        raise SpecError(f"{where}: expected a duration, got {raw!r}")
    if isinstance(raw, int | float):
        return f"{float(raw):.9f}".rstrip("0").rstrip(".") + "s"
    text = str(raw).strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?", text)
    if not m:
        raise SpecError(f"{where}: expected a duration like 30s, 5m or 0.5, got {raw!r}")
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[m.group(2)]
    return _duration(float(m.group(1)) * scale, where)


def _normalise(desc: Descriptor, data: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise SpecError(f"{where or 'spec'}: expected a mapping, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = desc.fields_by_name.get(key) or desc.fields_by_camelcase_name.get(key)
        path = f"{where}.{key}" if where else str(key)
        if field is None:
            known = ", ".join(sorted(desc.fields_by_name))
            raise SpecError(f"{path}: unknown key (known: {known})")
        if value is None:
            continue
        out[field.name] = _field(field, value, path)
    return out


def _field(field: FieldDescriptor, value: Any, path: str) -> Any:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        if not isinstance(value, Mapping):
            raise SpecError(f"{path}: expected a mapping")
        val_field = field.message_type.fields_by_name["value"]
        return {str(k): _scalar_or_message(val_field, v, f"{path}.{k}", map_value=True) for k, v in value.items()}
    if field.is_repeated:
        items = value if isinstance(value, list) else [value]
        return [_scalar_or_message(field, v, f"{path}[{i}]") for i, v in enumerate(items)]
    return _scalar_or_message(field, value, path)


def _scalar_or_message(field: FieldDescriptor, value: Any, path: str, map_value: bool = False) -> Any:
    if field.message_type is not None:
        full = field.message_type.full_name
        if full == "google.protobuf.Duration":
            return _duration(value, path)
        if full == "google.protobuf.Timestamp":
            return str(value)
        return _normalise(field.message_type, value, path)
    if field.enum_type is not None:
        return _enum_value(field, value, path)
    if field.type == FieldDescriptor.TYPE_STRING:
        if isinstance(value, bool):
            return "true" if value else "false"
        if map_value or isinstance(value, int | float):
            return str(value)
    return value


def to_message(cls: type[Message], data: Mapping[str, Any] | None, where: str = "") -> Message:
    """Build ``cls`` from a dict in the friendly form described in the module docstring."""
    msg = cls()
    if not data:
        return msg
    try:
        # The protobuf stub's DESCRIPTOR is a union with upb's Descriptor, the same class at runtime
        json_format.ParseDict(_normalise(cls.DESCRIPTOR, data, where), msg)  # type: ignore[arg-type]
    except json_format.ParseError as exc:
        raise SpecError(f"{where or cls.DESCRIPTOR.name}: {exc}") from None
    return msg


def check_training_sampling(sampling: common_pb2.SamplingParams, where: str) -> None:
    """Training rollouts sample from the whole distribution (docs/objective.md): vLLM's logprob of a token
    drawn under top-p or top-k truncation is not the probability the trainer's log-softmax over the whole
    vocabulary computes, so the loss's ratio (and every off-policy correction) would be off. ``SpecError``
    naming ``<where>.top_p`` (0 < top_p < 1) or ``<where>.top_k`` (> 0); 0, 1 and -1 mean no truncation."""
    if 0 < sampling.top_p < 1:
        raise SpecError(
            f"{where}.top_p: {sampling.top_p:g} truncates the distribution; training samples need top_p 1 (or 0)"
            " because the behaviour logprobs must be over the whole vocabulary"
        )
    if sampling.top_k > 0:
        raise SpecError(
            f"{where}.top_k: {sampling.top_k} truncates the distribution; training samples need top_k 0 or -1"
            " because the behaviour logprobs must be over the whole vocabulary"
        )


def job_spec(data: Mapping[str, Any]) -> trainer_pb2.TrainerJobSpec:
    spec: trainer_pb2.TrainerJobSpec = to_message(trainer_pb2.TrainerJobSpec, data, "job")  # type: ignore[assignment]
    check_training_sampling(spec.sampling, "job.sampling")
    return spec


LORA_KEYS = ("rank", "alpha", "dropout", "target_modules", "trainable_modules")
#: ``target_modules`` when a job names none: the attention and MLP projections of Llama/Qwen-style decoders.
LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def model_lora(data: Mapping[str, Any]) -> trainer_pb2.LoraConfig | None:
    """The job file's ``model.lora`` (LoRA training, docs/lora.md) as the ``LoraConfig`` the trainer's
    ``job.lora`` gets (``target_modules`` filled in with :data:`LORA_DEFAULT_TARGETS` when empty), or None (a
    full-weight job). A bad key or value is a ``SpecError`` naming ``model.lora.<key>``; the trainer's StartJob
    checks the module names against the model."""
    model = data.get("model")
    raw = model.get("lora") if isinstance(model, Mapping) else None
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecError(f"model.lora: expected a mapping ({', '.join(LORA_KEYS)}), got {raw!r}")
    cfg: trainer_pb2.LoraConfig = to_message(trainer_pb2.LoraConfig, raw, "model.lora")  # type: ignore[assignment]
    if not 1 <= cfg.rank <= 256:
        raise SpecError(f"model.lora.rank: expected an integer in [1, 256], got {raw.get('rank')!r}")
    if not math.isfinite(cfg.alpha) or cfg.alpha <= 0:
        raise SpecError(f"model.lora.alpha: expected a number > 0, got {raw.get('alpha')!r}")
    if not math.isfinite(cfg.dropout) or not 0 <= cfg.dropout < 1:
        raise SpecError(f"model.lora.dropout: expected a number in [0, 1), got {raw.get('dropout')!r}")
    if not cfg.target_modules:
        cfg.target_modules.extend(LORA_DEFAULT_TARGETS)
    return cfg


def sync_lora(data: dict[str, Any]) -> None:
    """Copy the job file's ``model.lora`` into ``job.lora`` (what the trainer reads), or refuse a ``job.lora``
    that says otherwise: LoRA is set once, under ``model``."""
    cfg = model_lora(data)
    if cfg is None:
        return
    job = data.get("job")
    if not isinstance(job, dict):
        return  # load_job_file/job_spec report a missing or malformed job section
    given = job.get("lora")
    settings = json_format.MessageToDict(cfg, preserving_proto_field_name=True)
    if given is not None and (not isinstance(given, Mapping) or model_lora({"model": {"lora": given}}) != cfg):
        raise SpecError("job.lora: differs from model.lora (set LoRA once, in model.lora)")
    job["lora"] = settings


def environment_spec(data: Mapping[str, Any]) -> envmanager_pb2.EnvironmentSpec:
    env: envmanager_pb2.EnvironmentSpec = to_message(envmanager_pb2.EnvironmentSpec, data, "environment")  # type: ignore[assignment]
    check_training_sampling(env.sampling, "environment.sampling")
    return env


def load_job_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a job file (validated section by section by the caller)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"job file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{p}: the top level must be a mapping")
    unknown = set(data) - {"job", "environment", "loops", "tasks", "model", "cluster", "run", "tracking", "eval"}
    if unknown:
        raise SpecError(f"{p}: unknown section(s) {sorted(unknown)}")
    if "job" not in data:
        raise SpecError(f"{p}: the job section is required")
    sync_lora(data)
    return data


TASK_KEYS = ("name", "environment", "prompts", "share", "loops", "reward", "envmanager", "affinity")
TASK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
ENVMANAGER_RE = re.compile(r"^envmanager(-[2-9]|-[1-9][0-9])?$")
MAX_TASKS = 64  # the ledger's bound


@dataclass
class JobTask:
    """One task of a multi-task job file, as ``rollart run`` uses it."""

    name: str  # the task tag: ledger pool, lease filter, affinity, metrics label
    share: float
    loops: int
    envmanager: str  # the envmanager instance whose loop group runs it
    environment: envmanager_pb2.EnvironmentSpec
    prompts: trainer_pb2.PromptSource  # task, environment, share and reward filled in
    affinity: llmproxy_pb2.AffinityRule | None  # task filled in; None: the proxy's default routing

    @property
    def where(self) -> str:
        return f"tasks[{self.name}]"


def job_tasks(data: Mapping[str, Any], default_loops: int = 16) -> list[JobTask]:
    """The ``tasks`` section of a job file (empty list for a one-environment job), checked field by field:
    a bad value is a ``SpecError`` naming ``tasks[i].<field>``. Environments, scorers and pools are checked
    against the running cluster by ``rollart run`` (see :func:`check_affinity_pools`)."""
    raw = data.get("tasks")
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        raise SpecError("tasks: expected a non-empty list of tasks")
    if len(raw) > MAX_TASKS:
        raise SpecError(f"tasks: at most {MAX_TASKS} tasks, got {len(raw)}")
    if data.get("environment"):
        raise SpecError("environment: a multi-task job gives each task its own (tasks[i].environment)")
    job = data.get("job") or {}
    if isinstance(job, Mapping) and job.get("prompts"):
        raise SpecError("job.prompts: a multi-task job gives each task its own (tasks[i].prompts)")
    out: list[JobTask] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        where = f"tasks[{i}]"
        if not isinstance(item, Mapping):
            raise SpecError(f"{where}: expected a mapping")
        unknown = sorted(set(item) - set(TASK_KEYS))
        if unknown:
            raise SpecError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(TASK_KEYS)})")
        env_raw = item.get("environment")
        if isinstance(env_raw, str):
            env_raw = {"environment": env_raw}
        if not isinstance(env_raw, Mapping) or not env_raw.get("environment"):
            raise SpecError(f"{where}.environment: required (an environment id, or a mapping with environment:)")
        env = to_message(envmanager_pb2.EnvironmentSpec, env_raw, f"{where}.environment")
        assert isinstance(env, envmanager_pb2.EnvironmentSpec)
        check_training_sampling(env.sampling, f"{where}.environment.sampling")
        name = str(item.get("name") or env.task or env.environment)
        if not TASK_RE.match(name):
            raise SpecError(f"{where}.name: {name!r} is not a task tag (letters, digits and ._:/@+-, up to 128)")
        if name in names:
            raise SpecError(f"{where}.name: task {name!r} is listed twice")
        names.add(name)
        if env.task and env.task != name:
            raise SpecError(f"{where}.environment.task: must be the task's name {name!r} (or left out)")
        env.task = name
        share = item.get("share", 1.0)
        if isinstance(share, bool) or not isinstance(share, int | float) or not math.isfinite(share) or share < 0:
            raise SpecError(f"{where}.share: expected a finite number >= 0, got {share!r}")
        loops = item.get("loops", default_loops)
        if isinstance(loops, bool) or not isinstance(loops, int) or not 1 <= loops <= 4096:
            raise SpecError(f"{where}.loops: expected an integer in [1, 4096], got {loops!r}")
        envmanager = str(item.get("envmanager", "envmanager"))
        if not ENVMANAGER_RE.match(envmanager):
            raise SpecError(f"{where}.envmanager: expected envmanager or envmanager-N (N in 2..99), got {envmanager!r}")
        prompts_raw = item.get("prompts") or {}
        if not isinstance(prompts_raw, Mapping):
            raise SpecError(f"{where}.prompts: expected a mapping")
        for key in ("task", "share"):
            if key in prompts_raw:
                raise SpecError(f"{where}.prompts.{key}: set by the task ({'name' if key == 'task' else key})")
        prompts = to_message(trainer_pb2.PromptSource, prompts_raw, f"{where}.prompts")
        assert isinstance(prompts, trainer_pb2.PromptSource)
        prompts.task, prompts.share = name, float(share)
        prompts.environment = prompts.environment or env.environment
        if item.get("reward") is not None:
            reward = to_message(common_pb2.RewardSpec, item["reward"], f"{where}.reward")
            assert isinstance(reward, common_pb2.RewardSpec)
            if env.HasField("reward"):
                raise SpecError(f"{where}.environment.reward: give the task's scorer once, as {where}.reward")
            env.reward.CopyFrom(reward)
        if env.HasField("reward"):
            prompts.reward.CopyFrom(env.reward)
        out.append(
            JobTask(name, float(share), loops, envmanager, env, prompts, _affinity(item.get("affinity"), name, where))
        )
    if not sum(t.share for t in out) > 0:
        raise SpecError("tasks[*].share: the shares must sum to a positive number")
    return out


def _affinity(raw: Any, task: str, where: str) -> llmproxy_pb2.AffinityRule | None:
    if raw is None:
        return None
    if raw == "auto":
        return llmproxy_pb2.AffinityRule(task=task, auto=True)
    if not isinstance(raw, Mapping):
        raise SpecError(
            f"{where}.affinity: expected auto or a mapping (pool, pool_kind, hardware_tags, allow_fallback)"
        )
    if "task" in raw or "from_binding" in raw:
        raise SpecError(f"{where}.affinity: task and from_binding are set by the task, not the job file")
    rule = to_message(llmproxy_pb2.AffinityRule, raw, f"{where}.affinity")
    assert isinstance(rule, llmproxy_pb2.AffinityRule)
    rule.task = task
    return rule


def check_affinity_pools(tasks: Sequence[JobTask], pools: set[str]) -> None:
    """A task whose affinity names a pool that no actor of the cluster serves, without fallback, could never
    be generated for: ``SpecError`` naming ``tasks[i].affinity.pool``."""
    for i, t in enumerate(tasks):
        rule = t.affinity
        if rule is not None and rule.pool and rule.pool not in pools and not rule.allow_fallback:
            raise SpecError(
                f"tasks[{i}].affinity.pool: no actor pool {rule.pool!r} in this cluster "
                f"(pools: {', '.join(sorted(pools)) or 'none'}) and no allow_fallback"
            )


# ``cluster.actors``: an int (that many actors in the actor's default pool) or a list of actor pools.
ACTOR_POOL_KEYS = ("pool", "kind", "count", "tags", "engine", "cpus", "pd_role")
ACTOR_KINDS = ("cpu", "gpu-compute", "gpu-bandwidth")
# Engine settings a pool may give its actors (rollart_actor.config.ActorConfig keys, as ROLLART_<KEY>).
ACTOR_ENGINE_KEYS = (
    "max_num_seqs",
    "kv_cache_gib",
    "max_model_len",
    "enable_prefix_caching",
    "chunked_prefill",
    "enforce_eager",
    "gpu_memory_utilization",
    "dtype",
    "seed",
    "scheduling_policy",
    "engine_args",
    "kv_transfer_config",
)
MAX_ACTORS = 64
_POOL_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_HW_TAG = re.compile(r"[A-Za-z0-9._:/=+@#~-]{1,128}")
_CPU_LIST = re.compile(r"[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*")


@dataclass(frozen=True)
class ActorPool:
    """One pool of ``cluster.actors``: ``count`` actors of one hardware kind, with their engine settings and
    CPU pinning (``cpus``: one taskset list for the pool, or one per actor)."""

    pool: str
    kind: str
    count: int
    tags: tuple[str, ...] = ()
    engine: tuple[tuple[str, Any], ...] = ()
    cpus: tuple[str, ...] = ()
    pd_role: str = "unified"

    def env(self, index: int) -> dict[str, str]:
        """The environment of the pool's ``index``-th actor (ROLLART_* settings of rollart-actor)."""
        env = {
            "ROLLART_POOL": self.pool,
            "ROLLART_POOL_KIND": self.kind,
            "ROLLART_HARDWARE__TAGS": json.dumps(list(self.tags)),
            "ROLLART_PD_ROLE": self.pd_role,
        }
        for key, value in self.engine:
            env[f"ROLLART_{key.upper()}"] = json.dumps(value) if not isinstance(value, str) else value
        if self.cpus:
            env["ROLLART_CPUS"] = self.cpus[index] if len(self.cpus) > 1 else self.cpus[0]
        return env


def cluster_actor_pools(cluster: Mapping[str, Any]) -> list[ActorPool]:
    """``cluster.actors`` as pools (empty list for the single-pool form ``actors: N`` or no key), each field
    checked: a bad value is a ``SpecError`` naming ``cluster.actors[i].<field>``."""
    raw = cluster.get("actors")
    if raw is None or (isinstance(raw, int) and not isinstance(raw, bool)):
        if raw is not None and not 1 <= raw <= MAX_ACTORS:
            raise SpecError(f"cluster.actors: expected 1 to {MAX_ACTORS} actors, got {raw}")
        return []
    if not isinstance(raw, list) or not raw:
        raise SpecError("cluster.actors: expected a number of actors or a non-empty list of pools")
    out: list[ActorPool] = []
    for i, item in enumerate(raw):
        where = f"cluster.actors[{i}]"
        if not isinstance(item, Mapping):
            raise SpecError(f"{where}: expected a mapping ({', '.join(ACTOR_POOL_KEYS)})")
        unknown = sorted(set(item) - set(ACTOR_POOL_KEYS))
        if unknown:
            raise SpecError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(ACTOR_POOL_KEYS)})")
        kind = str(item.get("kind", "cpu"))
        if kind not in ACTOR_KINDS:
            raise SpecError(f"{where}.kind: unknown kind {kind!r} (one of {', '.join(ACTOR_KINDS)})")
        pool = str(item.get("pool", kind))
        if not _POOL_NAME.fullmatch(pool):
            raise SpecError(f"{where}.pool: {pool!r} is not a pool name ([a-z0-9][a-z0-9._-]{{0,62}})")
        if any(p.pool == pool for p in out):
            raise SpecError(f"{where}.pool: pool {pool!r} is listed twice")
        count = item.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_ACTORS:
            raise SpecError(f"{where}.count: expected an integer in [1, {MAX_ACTORS}], got {count!r}")
        tags = item.get("tags") or []
        if not isinstance(tags, list):
            raise SpecError(f"{where}.tags: expected a list of tags")
        for j, tag in enumerate(tags):
            if not isinstance(tag, str) or not _HW_TAG.fullmatch(tag):
                raise SpecError(f"{where}.tags[{j}]: {tag!r} is not a tag (1-128 of A-Za-z0-9._:/=+@#~-)")
            if tag.startswith("kind:") and tag != f"kind:{kind}":
                raise SpecError(f"{where}.tags[{j}]: {tag!r} contradicts kind {kind!r}")
        engine = item.get("engine") or {}
        if not isinstance(engine, Mapping):
            raise SpecError(f"{where}.engine: expected a mapping of actor engine settings")
        for key in engine:
            if key not in ACTOR_ENGINE_KEYS:
                raise SpecError(f"{where}.engine.{key}: unknown engine setting (known: {', '.join(ACTOR_ENGINE_KEYS)})")
        cpus_raw = item.get("cpus")
        cpus: list[str] = []
        if cpus_raw is not None:
            cpus = [str(c) for c in cpus_raw] if isinstance(cpus_raw, list) else [str(cpus_raw)]
            if isinstance(cpus_raw, list) and len(cpus) != count:
                raise SpecError(f"{where}.cpus: a list gives one CPU list per actor ({count}), got {len(cpus)}")
            for c in cpus:
                if not _CPU_LIST.fullmatch(c):
                    raise SpecError(f"{where}.cpus: {c!r} is not a CPU list like 0, 0-3 or 0,2")
        pd_role = str(item.get("pd_role", "unified"))
        if pd_role not in ("unified", "prefill", "decode"):
            raise SpecError(f"{where}.pd_role: expected unified, prefill or decode, got {pd_role!r}")
        out.append(ActorPool(pool, kind, count, tuple(tags), tuple(engine.items()), tuple(cpus), pd_role))
    if sum(p.count for p in out) > MAX_ACTORS:
        raise SpecError(f"cluster.actors: at most {MAX_ACTORS} actors in all")
    return out


def model_dir_digest(path: str | Path) -> bytes:
    """:func:`weights_digest` of a Hugging Face checkpoint directory's ``*.safetensors`` files."""
    from rollart.delta import load_safetensors

    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise SpecError(f"{path}: no *.safetensors files")
    for f in files:
        ws = load_safetensors(f)
        arrays.update(ws.arrays)
        dtypes.update(ws.dtypes)
    return weights_digest(arrays, dtypes)


_SECTIONS: dict[str, type[Message]] = {"job": trainer_pb2.TrainerJobSpec, "environment": envmanager_pb2.EnvironmentSpec}
# The task fields that are messages (their subfields may be set one by one); the others are values.
_TASK_MESSAGES: dict[str, type[Message]] = {
    "environment": envmanager_pb2.EnvironmentSpec,
    "prompts": trainer_pb2.PromptSource,
    "reward": common_pb2.RewardSpec,
    "affinity": llmproxy_pb2.AffinityRule,
}
SECTIONS = ("job", "environment", "loops", "tasks", "model", "cluster", "run", "tracking", "eval")


def _task_name(item: Any) -> str:
    """A task's name as :func:`job_tasks` derives it (name, else the environment's task tag, else its id)."""
    if not isinstance(item, Mapping):
        return ""
    env = item.get("environment")
    env_map = env if isinstance(env, Mapping) else {"environment": env}
    return str(item.get("name") or env_map.get("task") or env_map.get("environment") or "")


def _select_task(data: dict[str, Any], key: str, parts: list[str]) -> tuple[dict[str, Any], str]:
    """``tasks.<name or index>.<field>...``: the task's mapping and how errors name it (``tasks.arith``)."""
    tasks = data.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise SpecError(f"--set {key}: the job file has no tasks list (a multi-task job's tasks:)")
    if len(parts) < 3 or any(not p for p in parts):
        raise SpecError(f"--set {key}: expected tasks.<name or index>.<field>, e.g. tasks.arith.share=3")
    which = parts[1]
    names = [_task_name(t) for t in tasks]
    if which.isdigit():
        if int(which) >= len(tasks):
            raise SpecError(f"--set {key}: no task at index {which} (indexes 0..{len(tasks) - 1})")
        item = tasks[int(which)]
    elif which in names:
        item = tasks[names.index(which)]
    else:
        raise SpecError(f"--set {key}: no task named {which!r} (tasks: {', '.join(names)})")
    if not isinstance(item, dict):
        raise SpecError(f"--set {key}: tasks.{which} is not a mapping")
    if parts[2] not in TASK_KEYS:
        raise SpecError(f"--set {key}: unknown task field {parts[2]!r} (known: {', '.join(TASK_KEYS)})")
    return item, f"tasks.{which}"


def _set_field(target: dict[str, Any], desc: Descriptor | None, parts: list[str], value: Any, key: str) -> None:
    """Set ``parts`` below ``target`` (a section, or a task field's mapping). With ``desc`` (the proto message
    ``target`` holds) every part must name a field; a map field's key is the rest of the path (it may contain
    dots); without one (free-form sections) any key goes."""
    i = 0
    while i < len(parts) - 1:
        part, where = parts[i], ".".join(parts[: i + 1])
        fd = desc.fields_by_name.get(part) if desc is not None else None
        if desc is not None and fd is None:
            raise SpecError(f"--set {key}: unknown key {where} (known: {', '.join(sorted(desc.fields_by_name))})")
        if desc is not None and (fd is None or fd.message_type is None):
            raise SpecError(f"--set {key}: {where} is a value, not a section")
        nxt = target.get(part)
        if nxt is None:
            nxt = target[part] = {}
        if not isinstance(nxt, dict):
            raise SpecError(f"--set {key}: {where} is a value, not a section")
        target = nxt
        if fd is not None and fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            parts = [*parts[: i + 1], ".".join(parts[i + 1 :])]  # the rest is one map key
            desc = None
            break
        desc = fd.message_type if fd is not None else None
        i += 1
    if desc is not None and parts[-1] not in desc.fields_by_name:
        raise SpecError(f"--set {key}: unknown key (known: {', '.join(sorted(desc.fields_by_name))})")
    target[parts[-1]] = value


def _set_task_field(data: dict[str, Any], key: str, parts: list[str], value: Any) -> None:
    item, where = _select_task(data, key, parts)
    field, rest = parts[2], parts[3:]
    if not rest:
        item[field] = value
        return
    if field not in _TASK_MESSAGES:
        raise SpecError(f"--set {key}: {where}.{field} is a value, not a section")
    current = item.get(field)
    if current is None:
        current = item[field] = {}
    elif field == "environment" and isinstance(current, str):  # the short form: an environment id
        current = item[field] = {"environment": current}
    elif not isinstance(current, dict):
        raise SpecError(f"--set {key}: {where}.{field} is {current!r}, not a mapping (set {where}.{field} whole)")
    _set_field(current, _TASK_MESSAGES[field].DESCRIPTOR, rest, value, key)  # type: ignore[arg-type]


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``rollart run --set KEY=VALUE``: set one job-file field per override (dotted path, YAML value).

    ``job.*`` and ``environment.*`` keys must name fields of their proto (any key below a map field, e.g.
    ``job.options.grpo.temperature``); ``tasks.<name or index>.<field>`` sets a field of one task of a
    multi-task job (``tasks.arith.share=3``, ``tasks.0.loops=4``, ``tasks.arith.affinity.allow_fallback=true``;
    below ``environment``, ``prompts``, ``reward`` and ``affinity`` the proto's fields); ``loops`` and the
    free-form ``model``, ``cluster``, ``run`` and ``tracking`` sections take any key below them
    (``tracking=false``: the whole section, every tracking backend off). The result is checked like a
    job file, so a bad value is a ``SpecError`` here, naming the path.
    """
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(f"--set {item!r}: expected KEY=VALUE, e.g. job.backend=megatron")
        parts = key.split(".")
        if parts[0] not in SECTIONS:
            raise SpecError(f"--set {key}: unknown section {parts[0]!r} ({', '.join(SECTIONS)})")
        whole = parts[0] in ("loops", "tracking")  # sections set whole: loops=16, tracking=false
        if (parts[0] == "loops" and len(parts) > 1) or (len(parts) == 1 and not whole) or any(not p for p in parts):
            raise SpecError(f"--set {key}: not a field path")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise SpecError(f"--set {key}: value is not valid YAML: {exc}") from None
        if parts[0] == "tasks":
            _set_task_field(data, key, parts, value)
            continue
        if parts[:2] == ["model", "lora"] and isinstance(data.get("job"), dict):
            data["job"].pop("lora", None)  # the copy of model.lora: made again below from the new value
        if len(parts) == 1:
            data[parts[0]] = value
            continue
        section = data.get(parts[0])
        if section is None:
            section = data[parts[0]] = {}
        if not isinstance(section, dict):
            raise SpecError(f"--set {key}: the {parts[0]} section is not a mapping")
        desc = _SECTIONS[parts[0]].DESCRIPTOR if parts[0] in _SECTIONS else None
        _set_field(section, desc, parts[1:], value, key)  # type: ignore[arg-type]
    if overrides:
        try:
            sync_lora(data)
            job_spec(data.get("job") or {})
            environment_spec(data.get("environment") or {})
            if any(o.partition("=")[0].strip().startswith("tasks.") for o in overrides):
                job_tasks(data)  # a task's value checked as the job file's would be (tasks[i].<field>)
            if any(o.partition("=")[0].strip().split(".")[0] == "tracking" for o in overrides):
                from .tracking_settings import settings as tracking_settings  # (it imports this module)

                tracking_settings(data)  # tracking=maybe or tracking.samples.every=-1 refused here, named
        except SpecError as exc:
            raise SpecError(f"--set: {exc}") from None
        if not isinstance(data.get("loops", 1), int):
            raise SpecError(f"--set loops: expected an integer, got {data['loops']!r}")
    return data
