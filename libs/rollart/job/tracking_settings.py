"""Experiment tracking's settings: the job file's ``tracking`` section checked field by field (a bad value is a
SpecError naming it), before anything of the run starts. ``tracking: false`` (or ``--set tracking=false``) turns
every backend and the samples off (docs/tracking.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .spec import SpecError

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
    enabled: bool = True  # tracking: false: no backend, no samples, no tracking.json
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
        return TrackingSettings(enabled=False, tensorboard=False, samples_every=0)
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
