"""Step metrics as JSON lines: plain numbers (durations in seconds, times as Unix seconds), one step a line.

``to_record`` turns a ``rollart.v1.StepMetrics`` into such a dict (duration fields get a ``_seconds``
suffix, e.g. ``train_time`` -> ``train_seconds``; other messages, such as the generation ``accounting``, become
nested dicts of plain numbers); ``from_record`` reverses it. The record also carries ``wasted_token_fraction`` and
``wasted_token_fraction_total`` at the top level (copies of the accounting's, for readers of the JSON lines).
A multi-task job's records carry ``tasks``: per task tag, its samples, groups, batch share, mean reward, mean
turns and tokens (``rollart.v1.TaskStepMetrics``); :func:`task_rewards` reads them back as one series per task.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from rollart.v1 import trainer_pb2

_DURATION = "google.protobuf.Duration"
_TIMESTAMP = "google.protobuf.Timestamp"


def _key(field: FieldDescriptor) -> str:
    if field.message_type is not None and field.message_type.full_name == _DURATION:
        return field.name.removesuffix("_time") + "_seconds"
    return field.name


def _plain(m: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in m.DESCRIPTOR.fields:
        value = getattr(m, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                out[field.name] = {k: _plain(v) for k, v in value.items()}  # e.g. per-task figures
            else:
                out[field.name] = dict(value)
        elif field.message_type is not None and field.message_type.full_name == _DURATION:
            out[_key(field)] = value.ToNanoseconds() / 1e9
        elif field.message_type is not None and field.message_type.full_name == _TIMESTAMP:
            out[field.name] = value.ToNanoseconds() / 1e9
        elif field.message_type is not None:
            out[field.name] = _plain(value)
        else:
            out[field.name] = value
    return out


def _fill(m: Any, d: dict[str, Any]) -> None:
    for field in m.DESCRIPTOR.fields:
        key = _key(field)
        if key not in d:
            continue
        value = d[key]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for k, v in value.items():
                    _fill(getattr(m, field.name)[k], v)
            else:
                getattr(m, field.name).update(value)
        elif field.message_type is not None and field.message_type.full_name in (_DURATION, _TIMESTAMP):
            if value:  # 0 is how to_record writes an unset one
                getattr(m, field.name).FromNanoseconds(int(float(value) * 1e9))
        elif field.message_type is not None:
            if isinstance(value, dict):
                _fill(getattr(m, field.name), value)
                if not getattr(m, field.name).ByteSize():  # all zeros is how to_record writes an unset one
                    m.ClearField(field.name)
        else:
            setattr(m, field.name, value)


def to_record(m: trainer_pb2.StepMetrics) -> dict[str, Any]:
    out = _plain(m)
    out["wasted_token_fraction"] = m.accounting.wasted_token_fraction
    out["wasted_token_fraction_total"] = m.accounting_total.wasted_token_fraction
    return out


def from_record(d: dict[str, Any]) -> trainer_pb2.StepMetrics:
    m = trainer_pb2.StepMetrics()
    _fill(m, d)
    return m


FATES = ("trained", "evicted", "cancelled", "rejected", "failed", "filtered")


def wasted_fraction(acc: Any) -> float:
    """Generated-but-not-trained tokens over generated tokens of a ``GenerationAccounting`` (0 when none)."""
    total = sum(getattr(acc, f).tokens for f in FATES)
    return (total - acc.trained.tokens) / total if total > 0 else 0.0


def accounting_delta(after: Any, before: Any) -> Any:
    """``after - before`` per fate, with its wasted fraction (a step's share of the ledger's cumulative one)."""
    from rollart.v1 import common_pb2

    out = common_pb2.GenerationAccounting()
    for f in FATES:
        a, b = getattr(after, f), getattr(before, f)
        getattr(out, f).samples = max(a.samples - b.samples, 0)
        getattr(out, f).tokens = max(a.tokens - b.tokens, 0)
    out.wasted_token_fraction = wasted_fraction(out)
    return out


def time_to_score(records: list[dict[str, Any]], target: float, window: int = 10) -> float | None:
    """Wall seconds from the first step's start until the ``window``-step moving average of the batch reward
    first reaches ``target`` (the end of that step); None when it never does. Steps restored after a restart
    keep their own start and end times, so the figure is the job's wall time."""
    recs = sorted(records, key=lambda r: r["step"])
    if not recs:
        return None
    t0 = float(recs[0].get("started_at") or 0.0)
    rewards: list[float] = []
    for r in recs:
        rewards.append(float(r.get("reward_mean", 0.0)))
        w = rewards[-window:]
        if len(w) == window and sum(w) / window >= target:
            return float(r.get("finished_at") or 0.0) - t0
    return None


def task_rewards(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """(step, mean reward) of each task by task tag, over the records of a multi-task job (empty otherwise);
    a step whose batch had no group of a task has no point for it."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in sorted(records, key=lambda r: r["step"]):
        for task, t in (r.get("tasks") or {}).items():
            if t.get("samples", 0) > 0:
                out.setdefault(task, []).append((int(r["step"]), float(t.get("reward_mean", 0.0))))
    return out


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a metrics file (lines that do not parse are skipped: a line cut by a crash)."""
    p = Path(path)
    if not p.is_file():
        return
    for line in p.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "step" in rec:
            yield rec


def append_records(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as fh:
        for rec in records:
            fh.write(json.dumps(rec, sort_keys=True) + "\n")
