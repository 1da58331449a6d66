"""Experiment tracking: every step's metrics and sampled trajectories to TensorBoard, W&B and MLflow.

The job file's ``tracking`` section (:func:`settings`) picks the backends: TensorBoard is on by default
(``<out>/tb``), W&B (offline unless ``mode: online``) and MLflow (a file store in ``<out>/mlruns`` unless a
``tracking_uri``) when their sub-section is given. :class:`Tracker` is the one call site the run loop feeds:
:meth:`Tracker.log_step` with a metrics.jsonl record, :meth:`Tracker.log_samples` with sampled trajectories
(rollart.job.samples). A backend that fails to start or to log says so in one line naming itself and the
run goes on with the others. The names every backend gets are :func:`metric_names` (docs/tracking.md).

Resume: ``<out>/tracking.json`` keeps the last step logged and the W&B and MLflow run ids, so a resumed run
continues the same runs (and the same TensorBoard folder) without logging a step twice.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .spec import SpecError

STATE_FILE = "tracking.json"
SAMPLES_FILE = "samples.jsonl"

# ------------------------------------------------------------------------------------------- metric names

# metrics.jsonl field -> name in every backend. Stable: dashboards and searches depend on them.
FIELDS: dict[str, str] = {
    "reward_mean": "reward/mean",
    "reward_std": "reward/std",
    "reward_min": "reward/min",
    "reward_max": "reward/max",
    "loss": "train/loss",
    "pg_loss": "train/pg_loss",
    "kl": "train/kl",
    "entropy": "train/entropy",
    "clip_fraction": "train/clip_fraction",
    "grad_norm": "train/grad_norm",
    "learning_rate": "train/learning_rate",
    "tokens_trained": "train/tokens",
    "samples": "train/samples",
    "groups": "train/groups",
    "response_length_mean": "response_length/mean",
    "staleness_mean": "staleness/mean",
    "staleness_max": "staleness/max",
    "rollout_tokens_per_s": "perf/rollout_tokens_per_s",
    "version_trained": "version/trained",
    "version_produced": "version/produced",
    "admitted": "settlement/admitted",
    "rejected": "settlement/rejected",
    "wasted_token_fraction": "generation/wasted_token_fraction",
    "wasted_token_fraction_total": "generation_total/wasted_token_fraction",
}
# StepMetrics.extra keys -> names (other extra keys: mismatch/<key> for ratio and mismatch figures, else extra/<key>).
EXTRA: dict[str, str] = {
    "turns_mean": "turns/mean",
    "behaviour_kl": "mismatch/behaviour_kl",
    "ratio_mean": "mismatch/ratio_mean",
    "train_tokens_per_s": "perf/train_tokens_per_s",
    "zero_advantage_groups": "train/zero_advantage_groups",
    "batch_min_version": "staleness/batch_min_version",
    "batch_max_version": "staleness/batch_max_version",
    "evicted": "generation/evicted_at_batch",
    "trainer_restarts": "train/restarts",
    "response_length_max": "response_length/max",
    "response_clip_fraction": "response_length/clip_ratio",
}
_MISMATCH = re.compile(r"^(ratio_|mismatch|is_|tis_|mis_|k3|fraction_(truncated|masked|capped))")
_VALIDATION = re.compile(r"^(eval|val|validation)(_|$)")


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}/{k}" if prefix else str(k), v, out)
        return
    v = _num(value)
    if v is not None and prefix:
        out[prefix] = v


def metric_names(record: Mapping[str, Any]) -> dict[str, float]:
    """One metrics.jsonl record as {stable name: value} (finite numbers only; the table in docs/tracking.md)."""
    out: dict[str, float] = {}
    for key, name in FIELDS.items():
        v = _num(record.get(key))
        if v is not None:
            out[name] = v
    for key, value in record.items():
        if key.endswith("_seconds") and _num(value) is not None:
            out["timing_s/" + key.removesuffix("_seconds")] = float(value)
        elif _VALIDATION.match(key):  # the validation figures, whatever their nesting (val/<task>/<stat>)
            rest = _VALIDATION.sub("", key)
            _flatten(f"val/{rest}" if rest else "val", value, out)
    extra = record.get("extra") or {}
    for key, value in extra.items():
        v = _num(value)
        if v is None or key.startswith("t_"):  # t_*: wall-clock timestamps of the timeline, not figures
            continue
        if key in EXTRA:
            out[EXTRA[key]] = v
        elif _VALIDATION.match(key):
            out["val/" + (_VALIDATION.sub("", key) or key)] = v
        elif _MISMATCH.match(key):
            out["mismatch/" + key] = v
        else:
            out["extra/" + key] = v
    r0, r1 = _num(extra.get("t_rollout_start")), _num(extra.get("t_rollout_end"))
    if r0 is not None and r1 is not None and r1 >= r0:
        out["timing_s/rollout"] = r1 - r0
    step_s, samples = _num(record.get("step_seconds")), _num(record.get("samples"))
    if step_s and samples is not None:
        out["perf/samples_per_s"] = samples / step_s
        tokens = _num(record.get("tokens_trained"))
        if tokens is not None:
            out["perf/trained_tokens_per_s"] = tokens / step_s
    for section, prefix in (("accounting", "generation"), ("accounting_total", "generation_total")):
        for fate, figures in (record.get(section) or {}).items():
            if isinstance(figures, Mapping):  # trained, evicted, cancelled, rejected, failed, filtered, ...
                for what in ("samples", "tokens"):
                    v = _num(figures.get(what))
                    if v is not None:
                        out[f"{prefix}/{fate}_{what}"] = v
    for task, figures in (record.get("tasks") or {}).items():
        if isinstance(figures, Mapping):
            for key, value in figures.items():
                v = _num(value)
                if v is not None:
                    out[f"task/{task}/{key}"] = v
    for actor, version in (record.get("actor_versions") or {}).items():
        v = _num(version)
        if v is not None:
            out[f"actor_version/{actor}"] = v
    return out


def validation_names(rec: Mapping[str, Any]) -> dict[str, float]:
    """A validation record (a ``"kind": "validation"`` line of metrics.jsonl, rollart.job.evaluation) as
    ``val/<task>/<stat>``: score, mean@n and pass@n (unless the evaluation failed), tokens, seconds, failures."""
    task = str(rec.get("task") or "default")
    n = rec.get("n")
    out: dict[str, float] = {}
    pairs = [("tokens", rec.get("tokens_generated")), ("seconds", rec.get("eval_seconds")),
             ("episodes_failed", rec.get("episodes_failed"))]
    if not rec.get("failed"):
        pairs += [("score", rec.get("score")), (f"mean@{n}", rec.get("mean_at_n")), (f"pass@{n}", rec.get("pass_at_n"))]
    for stat, value in pairs:
        v = _num(value)
        if v is not None:
            out[f"val/{task}/{stat}"] = v
    return out


# --------------------------------------------------------------------------------------------- settings

KEYS = ("enabled", "tensorboard", "wandb", "mlflow", "samples", "prometheus")
WANDB_KEYS = ("enabled", "project", "entity", "name", "tags", "mode", "id", "group", "notes")
MLFLOW_KEYS = ("enabled", "tracking_uri", "experiment", "run_name", "run_id", "tags")
SAMPLES_KEYS = ("every", "per_task", "max_chars")


@dataclass
class WandbSettings:
    project: str = "rollart"
    entity: str = ""
    name: str = ""
    tags: list[str] = field(default_factory=list)
    mode: str = "offline"  # offline | online: online is the only mode that reaches the network
    id: str = ""  # resume this run (default: the id tracking.json keeps for --resume, else a new one)
    group: str = ""
    notes: str = ""


@dataclass
class MlflowSettings:
    tracking_uri: str = ""  # empty: a file store in <out>/mlruns
    experiment: str = ""  # empty: the job id
    run_name: str = ""
    run_id: str = ""  # resume this run (default: the id tracking.json keeps for --resume)
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class TrackingSettings:
    tensorboard: bool = True
    wandb: WandbSettings | None = None
    mlflow: MlflowSettings | None = None
    samples_every: int = 5  # steps between sampled trajectories (and step 1); 0: none
    samples_per_task: int = 4
    samples_max_chars: int = 2000  # of each observation / action in a sample
    prometheus: bool = False  # rollart run: start Prometheus on the run's cluster (rollart.job.monitoring)


def _mapping(raw: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any] | None:
    """None when the sub-section is off (false / enabled: false), else its mapping checked against ``keys``."""
    if raw is None or raw is False:
        return None
    if raw is True:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: expected true, false or a mapping ({', '.join(keys)})")
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(keys)})")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise SpecError(f"{where}.enabled: expected true or false, got {enabled!r}")
    return dict(raw) if enabled else None


def _text(raw: Mapping[str, Any], key: str, where: str, pattern: str | None = None) -> str:
    value = raw.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise SpecError(f"{where}.{key}: expected a string, got {value!r}")
    text = str(value)
    if pattern and text and not re.fullmatch(pattern, text):
        raise SpecError(f"{where}.{key}: {text!r} does not match {pattern}")
    return text


def _int(raw: Mapping[str, Any], key: str, where: str, default: int, lo: int, hi: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SpecError(f"{where}.{key}: expected an integer in [{lo}, {hi}], got {value!r}")
    return value


def settings(data: Mapping[str, Any]) -> TrackingSettings:
    """The job file's ``tracking`` section, checked field by field (a bad value is a SpecError naming it)."""
    raw = data.get("tracking")
    if raw is None:
        return TrackingSettings()
    section = _mapping(raw, "tracking", KEYS)
    if section is None:  # tracking: false
        return TrackingSettings(tensorboard=False, samples_every=0)
    out = TrackingSettings()
    tb = section.get("tensorboard", True)
    if not isinstance(tb, bool):
        raise SpecError(f"tracking.tensorboard: expected true or false, got {tb!r}")
    out.tensorboard = tb
    prom = section.get("prometheus", False)
    if not isinstance(prom, bool):
        raise SpecError(f"tracking.prometheus: expected true or false, got {prom!r}")
    out.prometheus = prom
    wb = _mapping(section.get("wandb"), "tracking.wandb", WANDB_KEYS)
    if wb is not None:
        tags = wb.get("tags") or []
        if not isinstance(tags, list) or not all(isinstance(t, str | int) and not isinstance(t, bool) for t in tags):
            raise SpecError("tracking.wandb.tags: expected a list of strings")
        mode = _text(wb, "mode", "tracking.wandb") or "offline"
        if mode not in ("offline", "online"):
            raise SpecError(f"tracking.wandb.mode: expected offline or online, got {mode!r}")
        out.wandb = WandbSettings(
            project=_text(wb, "project", "tracking.wandb", r"[^/\\#?%:]{1,128}") or "rollart",
            entity=_text(wb, "entity", "tracking.wandb"),
            name=_text(wb, "name", "tracking.wandb"),
            tags=[str(t) for t in tags],
            mode=mode,
            id=_text(wb, "id", "tracking.wandb", r"[A-Za-z0-9_-]{1,64}"),
            group=_text(wb, "group", "tracking.wandb"),
            notes=_text(wb, "notes", "tracking.wandb"),
        )
    ml = _mapping(section.get("mlflow"), "tracking.mlflow", MLFLOW_KEYS)
    if ml is not None:
        tags_raw = ml.get("tags") or {}
        if not isinstance(tags_raw, Mapping):
            raise SpecError("tracking.mlflow.tags: expected a mapping of tag -> value")
        out.mlflow = MlflowSettings(
            tracking_uri=_text(ml, "tracking_uri", "tracking.mlflow"),
            experiment=_text(ml, "experiment", "tracking.mlflow"),
            run_name=_text(ml, "run_name", "tracking.mlflow"),
            run_id=_text(ml, "run_id", "tracking.mlflow", r"[A-Za-z0-9_-]{1,64}"),
            tags={str(k): str(v) for k, v in tags_raw.items()},
        )
    samples = section.get("samples", {})
    if samples is False:
        out.samples_every = 0
    elif samples is not None and samples is not True:
        if not isinstance(samples, Mapping):
            raise SpecError("tracking.samples: expected false or a mapping (every, per_task, max_chars)")
        unknown = sorted(set(samples) - set(SAMPLES_KEYS))
        if unknown:
            raise SpecError(f"tracking.samples.{unknown[0]}: unknown key (known: {', '.join(SAMPLES_KEYS)})")
        out.samples_every = _int(samples, "every", "tracking.samples", out.samples_every, 0, 1_000_000)
        out.samples_per_task = _int(samples, "per_task", "tracking.samples", out.samples_per_task, 1, 256)
        out.samples_max_chars = _int(samples, "max_chars", "tracking.samples", out.samples_max_chars, 16, 1_000_000)
    return out


def sample_step(s: TrackingSettings, step: int) -> bool:
    """Whether trajectories are sampled at ``step``: step 1 and every ``samples_every``-th step."""
    return s.samples_every > 0 and (step == 1 or step % s.samples_every == 0)


# --------------------------------------------------------------------------------------------- backends


class Backend:
    """One tracking library. ``start`` raises when it cannot start; the tracker then drops it."""

    name = ""

    def start(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def log(self, step: int, values: dict[str, float], wall_time: float) -> None:
        raise NotImplementedError

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def validation(self, step: int, values: dict[str, float], wall_time: float) -> None:
        """Validation figures at the step they evaluated (which may come after later steps' metrics)."""
        self.log(step, values, wall_time)

    def close(self, ok: bool) -> None:
        raise NotImplementedError


class TensorBoardBackend(Backend):
    """Event files in ``<out>/tb`` written with TensorBoard's own event-file writer (no TensorFlow, no torch)."""

    name = "tensorboard"

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.writer: Any = None

    def start(self, state: dict[str, Any]) -> None:
        writer = importlib.import_module("tensorboard.summary.writer.event_file_writer")
        self.pb = importlib.import_module("tensorboard.compat.proto.event_pb2")
        self.spb = importlib.import_module("tensorboard.compat.proto.summary_pb2")
        self.tpb = importlib.import_module("tensorboard.compat.proto.tensor_pb2")
        self.types = importlib.import_module("tensorboard.compat.proto.types_pb2")
        self.text_meta = importlib.import_module("tensorboard.plugins.text.metadata")
        self.logdir.mkdir(parents=True, exist_ok=True)
        # A resumed run appends a new event file to the same folder: TensorBoard reads them as one run.
        self.writer = writer.EventFileWriter(str(self.logdir), flush_secs=10)

    def log(self, step: int, values: dict[str, float], wall_time: float) -> None:
        value = [self.spb.Summary.Value(tag=k, simple_value=v) for k, v in values.items()]
        self.writer.add_event(self.pb.Event(wall_time=wall_time, step=step, summary=self.spb.Summary(value=value)))
        self.writer.flush()

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        md = self.text_meta.create_summary_metadata("", "")
        by_task: dict[str, list[str]] = {}
        for row in rows:
            by_task.setdefault(str(row.get("task", "")), []).append(markdown(row))
        value = []
        for task, texts in sorted(by_task.items()):
            tensor = self.tpb.TensorProto(dtype=self.types.DT_STRING, string_val=["\n\n---\n\n".join(texts).encode()])
            value.append(self.spb.Summary.Value(tag=f"samples/{task or 'default'}", metadata=md, tensor=tensor))
        self.writer.add_event(self.pb.Event(wall_time=time.time(), step=step, summary=self.spb.Summary(value=value)))
        self.writer.flush()

    def close(self, ok: bool) -> None:
        if self.writer is not None:
            self.writer.close()


class WandbBackend(Backend):
    """A W&B run: offline (``<out>/wandb/offline-run-*``, uploaded later with ``wandb sync``) unless online."""

    name = "wandb"

    def __init__(self, s: WandbSettings, out: Path, job_id: str, config: dict[str, Any]) -> None:
        self.s = s
        self.out = out
        self.job_id = job_id
        self.config = config
        self.run: Any = None
        self.step = 0

    def start(self, state: dict[str, Any]) -> None:
        if self.s.mode == "offline":
            os.environ["WANDB_MODE"] = "offline"  # nothing may reach the network unless the job file says online
        wandb = importlib.import_module("wandb")
        self.wandb = wandb
        run_id = self.s.id or state.get("wandb", {}).get("id") or secrets.token_hex(4)
        self.run = wandb.init(
            project=self.s.project,
            entity=self.s.entity or None,
            name=self.s.name or self.job_id,
            tags=self.s.tags or None,
            group=self.s.group or None,
            notes=self.s.notes or None,
            id=run_id,
            resume="allow",
            mode=self.s.mode,
            dir=str(self.out),
            config=self.config,
            # The run's own console and the system monitor would compete with the job for 2 cores.
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        # Validation arrives after later steps: its charts use its own x-axis (W&B refuses steps that go back).
        self.run.define_metric("val/step")
        self.run.define_metric("val/*", step_metric="val/step")
        state["wandb"] = {"id": run_id, "dir": str(self.run.dir), "mode": self.s.mode}

    def log(self, step: int, values: dict[str, float], wall_time: float) -> None:
        self.run.log(values, step=step)
        self.step = max(self.step, step)

    def validation(self, step: int, values: dict[str, float], wall_time: float) -> None:
        self.run.log({**values, "val/step": step}, step=max(step, self.step))

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        cols, data = table(rows)
        # W&B drops what is logged below its current step: samples read after their step's metrics go to that
        # row (the table's step column keeps their own step).
        self.run.log({"samples": self.wandb.Table(columns=cols, data=data)}, step=max(step, self.step))

    def close(self, ok: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if ok else 1)


def _mlflow_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", name)  # the characters MLflow accepts in a metric name


class MlflowBackend(Backend):
    """An MLflow run in a file store (``<out>/mlruns``) unless a tracking URI is configured."""

    name = "mlflow"

    def __init__(self, s: MlflowSettings, out: Path, job_id: str, params: dict[str, str]) -> None:
        self.s = s
        self.out = out
        self.job_id = job_id
        self.params = params
        self.client: Any = None
        self.run_id = ""

    def uri(self) -> str:
        return self.s.tracking_uri or (self.out / "mlruns").resolve().as_uri()

    def start(self, state: dict[str, Any]) -> None:
        uri = self.uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps the file store in maintenance mode behind this switch; a local folder needs no server.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        tracking = importlib.import_module("mlflow.tracking")
        self.entities = importlib.import_module("mlflow.entities")
        self.client = tracking.MlflowClient(tracking_uri=uri)
        run_id = self.s.run_id or state.get("mlflow", {}).get("run_id", "")
        if run_id:
            run = self.client.get_run(run_id)  # raises when the store does not have it
            self.client.update_run(run_id, status="RUNNING")
        else:
            name = self.s.experiment or self.job_id or "rollart"
            exp = self.client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
            run = self.client.create_run(exp_id, run_name=self.s.run_name or self.job_id, tags=self.s.tags)
            run_id = run.info.run_id
            params = [self.entities.Param(_mlflow_name(k)[:250], v[:6000]) for k, v in sorted(self.params.items())]
            for i in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[i : i + 100])
        self.run_id = run_id
        state["mlflow"] = {"run_id": run_id, "tracking_uri": uri, "experiment_id": run.info.experiment_id}

    def log(self, step: int, values: dict[str, float], wall_time: float) -> None:
        ts = int(wall_time * 1000)
        metrics = [self.entities.Metric(_mlflow_name(k), v, ts, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        cols, data = table(rows)
        # MLflow's table artifact layout (columns + data), without the pandas that log_table needs.
        self.client.log_dict(self.run_id, {"columns": cols, "data": data}, f"samples/step_{step:06d}.json")

    def close(self, ok: bool) -> None:
        if self.client is not None and self.run_id:
            self.client.set_terminated(self.run_id, status="FINISHED" if ok else "KILLED")


# ---------------------------------------------------------------------------------------------- samples

COLUMNS = ["step", "task", "reward", "version", "staleness", "turns", "prompt", "conversation", "trajectory_id"]


def conversation(row: Mapping[str, Any]) -> str:
    """The turns of a sample as plain text (observation, then the policy's action)."""
    parts = []
    for i, t in enumerate(row.get("turns") or []):
        parts.append(f"[{i}] env: {t.get('observation', '')}\n[{i}] policy: {t.get('action', '')}")
    return "\n".join(parts)


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    data = [
        [
            r.get("step"),
            r.get("task", ""),
            r.get("reward"),
            r.get("version"),
            r.get("staleness"),
            len(r.get("turns") or []),
            r.get("prompt", ""),
            conversation(r),
            r.get("trajectory_id", ""),
        ]
        for r in rows
    ]
    return list(COLUMNS), data


def markdown(row: Mapping[str, Any]) -> str:
    head = (
        f"**{row.get('task', '')}** reward {row.get('reward')} · version {row.get('version')} · "
        f"staleness {row.get('staleness')} · {len(row.get('turns') or [])} turns · `{row.get('trajectory_id', '')}`"
    )
    body = "\n\n".join(
        f"*env:* `{_md(t.get('observation', ''))}`\n\n*policy:* `{_md(t.get('action', ''))}`"
        for t in row.get("turns") or []
    )
    return head + "\n\n" + body


def _md(text: str) -> str:
    return " ".join(str(text).replace("`", "'").split())


# ---------------------------------------------------------------------------------------------- tracker


def _flat_params(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(_flat_params(v, key))
        else:
            out[key] = json.dumps(v) if not isinstance(v, str) else v
    return out


class Tracker:
    """Feeds every configured backend from one place; ``<out>/tracking.json`` carries the resume state."""

    def __init__(
        self,
        s: TrackingSettings,
        out: Path,
        job_id: str,
        job_data: Mapping[str, Any] | None = None,
        *,
        fresh: bool = True,
        log: Callable[[str], None] = print,
    ) -> None:
        self.s = s
        self.out = out
        self.job_id = job_id
        self.job_data = dict(job_data or {})
        self.fresh = fresh
        self.say = log
        self.backends: list[Backend] = []
        self.state: dict[str, Any] = {}
        self.last_step = 0

    @property
    def state_path(self) -> Path:
        return self.out / STATE_FILE

    def _candidates(self) -> list[Backend]:
        out: list[Backend] = []
        if self.s.tensorboard:
            out.append(TensorBoardBackend(self.out / "tb"))
        if self.s.wandb is not None:
            out.append(WandbBackend(self.s.wandb, self.out, self.job_id, self.job_data))
        if self.s.mlflow is not None:
            params = _flat_params(self.job_data.get("job") or {})
            out.append(MlflowBackend(self.s.mlflow, self.out, self.job_id, params))
        return out

    def start(self) -> list[str]:
        """Start every backend (a fresh run first clears the previous one's TensorBoard folder, samples and
        resume state; W&B and MLflow keep their earlier runs beside the new one). Returns the started names."""
        self.out.mkdir(parents=True, exist_ok=True)
        if self.fresh:
            shutil.rmtree(self.out / "tb", ignore_errors=True)
            for name in (STATE_FILE, SAMPLES_FILE):
                (self.out / name).unlink(missing_ok=True)
        elif self.state_path.is_file():
            try:
                self.state = json.loads(self.state_path.read_text())
            except ValueError:
                self.say(f"tracking         {self.state_path} is not JSON: starting new tracking runs")
                self.state = {}
        self.last_step = int(self.state.get("last_step", 0))
        for b in self._candidates():
            try:
                b.start(self.state)
            except Exception as exc:  # any library error: the run goes on without this backend
                self.say(f"tracking         {b.name} did not start ({_line(exc)}); going on without it")
                continue
            self.backends.append(b)
        self._save()
        if self.backends:
            self.say(f"tracking         {', '.join(self._describe(b) for b in self.backends)}")
        return [b.name for b in self.backends]

    def _describe(self, b: Backend) -> str:
        if isinstance(b, TensorBoardBackend):
            return f"tensorboard {b.logdir}"
        if isinstance(b, WandbBackend):
            return f"wandb {b.s.mode} run {self.state.get('wandb', {}).get('id')}"
        if isinstance(b, MlflowBackend):
            return f"mlflow run {b.run_id} at {b.uri()}"
        return b.name

    def _save(self) -> None:
        self.state["last_step"] = self.last_step
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.state_path)

    def _each(self, what: str, call: Callable[[Backend], None]) -> None:
        for b in list(self.backends):
            try:
                call(b)
            except Exception as exc:
                self.say(f"tracking         {b.name} failed to log {what} ({_line(exc)}); dropped")
                self.backends.remove(b)
                with contextlib.suppress(Exception):
                    b.close(ok=False)

    def log_step(self, record: Mapping[str, Any]) -> bool:
        """Log one metrics.jsonl record; False (nothing logged) when its step was logged before (a resume)."""
        step = int(record.get("step", 0))
        if step <= self.last_step:
            return False
        values = metric_names(record)
        wall = float(record.get("finished_at") or 0.0) or time.time()
        self._each(f"step {step}", lambda b: b.log(step, values, wall))
        self.last_step = step
        self._save()
        return True

    def log_validation(self, rec: Mapping[str, Any]) -> bool:
        """Log one validation record at its ``eval_step``; False when that task's step was logged before."""
        task = str(rec.get("task") or "default")
        step = int(rec.get("eval_step", 0))
        logged = self.state.setdefault("validation", {})
        if step <= int(logged.get(task, -1)):
            return False
        values = validation_names(rec)
        wall = float(rec.get("finished_at") or 0.0) or time.time()
        self._each(f"validation of step {step}", lambda b: b.validation(step, values, wall))
        logged[task] = step
        self._save()
        return True

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Sampled trajectories of ``step``: ``<out>/samples.jsonl`` and a table (text) in every backend."""
        if not rows:
            return
        with (self.out / SAMPLES_FILE).open("a") as fh:
            for row in rows:
                fh.write(json.dumps(row, sort_keys=True) + "\n")
        self._each(f"samples of step {step}", lambda b: b.samples(step, rows))

    def close(self, ok: bool = True) -> None:
        for b in self.backends:
            with contextlib.suppress(Exception):
                b.close(ok)
        self.backends = []


def _line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: " + " ".join(str(exc).split())[:300]


# ------------------------------------------------------------------------------------------- rollart run


class RunTracking:
    """What ``rollart run`` calls: settings checked before the cluster starts, then the Prometheus targets of
    its cluster, the tracker, and each trainer event (step metrics; rollout samples of sampled steps)."""

    # Phases of step s that come after its batch was formed and before the trainer acknowledges it.
    SAMPLE_PHASES = ("STEP_PHASE_SUSPEND", "STEP_PHASE_TRAIN", "STEP_PHASE_CHECKPOINT")

    def __init__(
        self, data: Mapping[str, Any], out: Path, job_id: str, *, fresh: bool, say: Callable[[str], None]
    ) -> None:
        self.s = settings(data)
        self.data = data
        self.out = out
        self.job_id = job_id
        self.fresh = fresh
        self.say = say
        self.tracker: Tracker | None = None
        self.state_dir: Path | None = None
        self.ledger = ""
        self.token = ""
        self.batch_size = 0
        self.asked: set[int] = set()
        self.metrics_offset = 0  # validation lines of metrics.jsonl read so far (rollart.job.evaluation)

    def start(self, state_dir: Path, state: dict[str, Any], token: str, batch_size: int) -> None:
        from . import monitoring

        self.state_dir, self.token, self.batch_size = state_dir, token, batch_size
        self.ledger = state.get("services", {}).get("ledger", {}).get("address", "")
        try:  # any Prometheus can scrape the run's cluster from these (docs/tracking.md)
            monitoring.write_targets(state_dir, state)
            monitoring.write_config(state_dir)
            if self.s.prometheus:
                prom = monitoring.start(state_dir)
                self.say(f"prometheus       {prom['url']} (targets {monitoring.folder(state_dir) / 'targets.json'})")
        except Exception as exc:
            self.say(f"prometheus       did not start ({_line(exc)}); going on without it")
        self.tracker = Tracker(self.s, self.out, self.job_id, self.data, fresh=self.fresh, log=self.say)
        self.tracker.start()

    async def on_event(self, ev: Any) -> None:
        """A TrainerEvent of WatchJob: never raises (tracking must not stop the run's watch)."""
        if self.tracker is None:
            return
        kind = ev.WhichOneof("event")
        try:
            if kind == "step_finished":
                from .metrics import to_record

                self.tracker.log_step(to_record(ev.step_finished))
            elif kind == "phase":
                await self._sample(ev.phase.step, ev.phase.phase)
            self._validation()
        except Exception as exc:
            self.say(f"tracking         {kind} event not tracked ({_line(exc)})")

    def _validation(self) -> None:
        """Validation records appended to metrics.jsonl since the last look (whole lines only)."""
        path = self.out / "metrics.jsonl"
        if self.tracker is None or not path.is_file():
            return
        with path.open("rb") as fh:
            fh.seek(self.metrics_offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1
        self.metrics_offset += end
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("kind") == "validation" and "eval_step" in rec:
                self.tracker.log_validation(rec)

    async def _sample(self, step: int, phase: int) -> None:
        from rollart.v1 import trainer_pb2

        from . import samples

        name = trainer_pb2.StepPhase.Name(phase) if phase in trainer_pb2.StepPhase.values() else ""
        if name not in self.SAMPLE_PHASES or step in self.asked or not sample_step(self.s, step) or not self.ledger:
            return
        if self.tracker is None or step <= self.tracker.last_step:  # a resumed run's steps logged before
            return
        self.asked.add(step)
        batch = await samples.read_batch(self.ledger, self.token, step, self.batch_size)
        if batch is None:
            self.say(f"tracking         step {step}: its batch was acknowledged before it could be sampled")
            return
        self.tracker.log_samples(step, samples.rows(batch, step, self.s.samples_per_task, self.s.samples_max_chars))

    def close(self, ok: bool) -> None:
        if self.tracker is not None:
            with contextlib.suppress(Exception):
                self._validation()  # the evaluation after the last step
            self.tracker.close(ok)
            self.tracker = None

    def stop(self) -> None:
        """Stop the run's Prometheus (teardown; nothing when none was started)."""
        from . import monitoring

        if self.state_dir is not None and not monitoring.stop(self.state_dir):
            self.say("prometheus       STILL RUNNING")
