"""Step metrics as JSON lines: plain numbers (durations in seconds, times as Unix seconds), one step a line.

``to_record`` turns a ``rollart.v1.StepMetrics`` into such a dict (duration fields get a ``_seconds``
suffix, e.g. ``train_time`` -> ``train_seconds``); ``from_record`` reverses it.
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


def to_record(m: trainer_pb2.StepMetrics) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in m.DESCRIPTOR.fields:
        value = getattr(m, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = dict(value)
        elif field.message_type is not None and field.message_type.full_name == _DURATION:
            out[_key(field)] = value.ToNanoseconds() / 1e9
        elif field.message_type is not None and field.message_type.full_name == _TIMESTAMP:
            out[field.name] = value.ToNanoseconds() / 1e9
        else:
            out[field.name] = value
    return out


def from_record(d: dict[str, Any]) -> trainer_pb2.StepMetrics:
    m = trainer_pb2.StepMetrics()
    for field in m.DESCRIPTOR.fields:
        key = _key(field)
        if key not in d:
            continue
        value = d[key]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            getattr(m, field.name).update(value)
        elif field.message_type is not None and field.message_type.full_name in (_DURATION, _TIMESTAMP):
            if value:  # 0 is how to_record writes an unset one
                getattr(m, field.name).FromNanoseconds(int(float(value) * 1e9))
        else:
            setattr(m, field.name, value)
    return m


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
