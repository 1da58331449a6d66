"""Experiment tracking's metric names: a metrics.jsonl record (and a validation record) as the stable names
every backend gets (the table in docs/tracking.md). Dashboards and searches depend on them: keep them."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

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
