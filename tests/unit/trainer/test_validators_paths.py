"""The trainer's spec check refuses path, URI and model strings the file system or a loader cannot take."""

from __future__ import annotations

import pytest

from rollart.runtime import errors
from rollart.v1 import trainer_pb2 as T
from rollart_trainer import validators

HOSTILE = {
    "rtl-emoji": ("\u200f\u202e🧪" * 300),  # 900 characters, 3 KB: "File name too long" if it reached the disk
    "nul": "/models/qwen\x00.bin",
    "long": "é" * 5000,
}


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.parametrize(
    "field, setter",
    [
        ("spec.model", lambda s, x: setattr(s, "model", x)),
        ("spec.publish.checkpoint_store", lambda s, x: setattr(s.publish, "checkpoint_store", x)),
        ("spec.checkpoint.uri", lambda s, x: setattr(s.checkpoint, "uri", x)),
        ("spec.prompts.dataset_uri", lambda s, x: setattr(s.prompts, "dataset_uri", x)),
        ("spec.metrics_path", lambda s, x: setattr(s, "metrics_path", x)),
    ],
)
def test_path_fields_are_refused_naming_the_field(field, setter, value, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec = T.TrainerJobSpec(job_id="job", model=str(model), batch_size=4, group_size=2)
    setter(spec, value)
    with pytest.raises(errors.InvalidArgument) as info:
        validators.check_spec(spec)
    assert info.value.field == field


def test_unparsable_dataset_uri_is_refused():
    spec = T.TrainerJobSpec(job_id="job", model="Qwen/Qwen3-0.6B", batch_size=4, group_size=2)
    spec.prompts.dataset_uri = "http://[::1/prompts.jsonl"
    with pytest.raises(errors.InvalidArgument, match="not a valid URI") as info:
        validators.check_spec(spec)
    assert info.value.field == "spec.prompts.dataset_uri"
